"""attngpt's data: text corpus -> token shards -> random training batches.

    config.py     DataConfig, the `data:` section of a run's YAML
    tokenizer.py  CharTokenizer and TiktokenTokenizer (GPT-2 BPE) behind one interface, as JSON
    sources.py    the data folder, tinyshakespeare, local text files and `datasets` sources (corpus.py: a
                  resolved Corpus; source_errors.py: why one failed to load or read, naming the file)
    splitting.py  deterministic train/val splits and safe cuts of long texts
    pipeline.py   encoding a continuous text into shards; helpers shared by every encoding pass
    sharded.py    document corpora encoded part by part in worker processes, resumable (workers.py: the pool)
    prepare.py    prepare_data, the one writer (under a lock), and `python -m data.prepare CONFIG`
    prepared.py   load_prepared: a prepared folder opened read-only and checked (shards.py: reading shards)
    loader.py     BatchLoader: seeded, resumable random windows from a split's shards

Nothing here imports model/ or training/; `datasets` is imported only when a corpus is actually read.
"""
