"""attngpt's data: text corpus -> token bins -> random training batches.

    config.py     DataConfig, the `data:` section of a run's YAML
    tokenizer.py  CharTokenizer and TiktokenTokenizer (GPT-2 BPE) behind one interface, as JSON
    sources.py    the data folder, tinyshakespeare, local text files and `datasets` sources
    splitting.py  deterministic train/val splits and safe cuts of long texts
    pipeline.py   the passes that encode rows into train.bin / val.bin
    prepare.py    prepare_data / load_prepared, and `python -m data.prepare CONFIG`
    loader.py     BatchLoader: seeded, resumable random windows from a bin

Nothing here imports model/ or training/; `datasets` is imported only when a corpus is actually read.
"""
