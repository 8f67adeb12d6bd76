"""What we learn from attention maps: per-head statistics, heatmaps and dumps.

    stats.py    entropy, sink mass, mean distance, decay exponent (and its fit's R²) per head
    roles.py    head roles: previous-token, duplicate-token and induction scores on a seeded role probe
    ablation.py the loss a head's removal costs (zero or mean ablation), per-position losses
    icl.py      the in-context-learning score: late minus early loss
    heatmap.py  a layer's heads as one grid of heatmaps (matplotlib, imported lazily)
    dump.py     `sample.py --dump-attn`: attn.npz + heatmaps over a prompt

Imports model/ at most, never the other way round: the model computes the maps (`GPT.attention_maps`),
this package reads them.
"""
import typing

# how ablation.py removes a head, and "off": the run's setting for no ablation (ablation_dloss refuses it). Here,
# not in ablation.py, so that the run config (training/config.py) checks attn.ablation without loading torch
AblationMode = typing.Literal["zero", "mean", "off"]
ABLATION_MODES: tuple[str, ...] = typing.get_args(AblationMode)
