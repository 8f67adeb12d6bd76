"""What we learn from attention maps: per-head statistics, heatmaps and dumps.

    stats.py    entropy, sink mass, mean distance, decay exponent per head
    heatmap.py  a layer's heads as one grid of heatmaps (matplotlib, imported lazily)
    dump.py     `sample.py --dump-attn`: attn.npz + heatmaps over a prompt

Imports model/ at most, never the other way round: the model computes the maps (`GPT.attention_maps`),
this package reads them.
"""
