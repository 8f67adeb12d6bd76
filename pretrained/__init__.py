"""Models from elsewhere, with their tokenizers: an attngpt checkpoint (folder or a run's out_dir), a
Hugging Face model folder, or a hub id -- one `open_pretrained(src)` for sample.py, convert.py and
train.init_from; and the two conversions of convert.py.

It joins model/ (the network and its Hugging Face weight mapping) with data/ (the tokenizers), which may
not import each other.
"""
