"""What attngpt reads of a Hugging Face config.json, as types and ranges (common/schema.py): every key it reads is
checked before any of it is used, so a damaged or hostile file is one line naming the key (`n_layer is 1e+400`,
`architectures is 'GPT2LMHeadModel' (a string), expected a list`), never a traceback or a silent conversion
(16.5 read as 16, "2" as 2, true as 1). Keys attngpt does not read are left alone: real configs carry dozens.
Sizes have no upper bound here: the model they make is checked against memory before anything is built
(pretrained/memory.py).
"""
from __future__ import annotations

from common.schema import AnyOf, Bool, Fields, Float, Int, ListOf, Nullable, Str

POSITIVE = Int(1)
EPSILON = Float(above=0, below=1)
TOKEN_IDS = Nullable(AnyOf(Int(0), ListOf(Int(0))))  # eos_token_id: one id, several (Llama 3), or none

# read by config_map.hf_model_type, before the architecture is known
KIND = Fields({"architectures": Nullable(ListOf(Str())), "model_type": Nullable(Str())})

_COMMON = {"vocab_size": POSITIVE, "tie_word_embeddings": Bool(), "bos_token_id": TOKEN_IDS,
           "eos_token_id": TOKEN_IDS}

GPT2 = Fields({
    **_COMMON, "n_positions": POSITIVE, "n_layer": POSITIVE, "n_head": POSITIVE, "n_embd": POSITIVE,
    "n_inner": Nullable(POSITIVE), "activation_function": Str(), "layer_norm_epsilon": EPSILON,
    "scale_attn_by_inverse_layer_idx": Bool(), "scale_attn_weights": Bool(), "add_cross_attention": Bool(),
}, required=("vocab_size", "n_positions", "n_layer", "n_head", "n_embd"))

# rope_scaling (classic) and rope_parameters (transformers 5): only the kind and the base are read
ROPE = Fields({"rope_type": Nullable(Str()), "type": Nullable(Str()), "rope_theta": Nullable(Float(above=0))})

LLAMA = Fields({
    **_COMMON, "hidden_size": POSITIVE, "intermediate_size": POSITIVE, "num_hidden_layers": POSITIVE,
    "num_attention_heads": POSITIVE, "num_key_value_heads": Nullable(POSITIVE), "head_dim": Nullable(POSITIVE),
    "max_position_embeddings": POSITIVE, "hidden_act": Str(), "sliding_window": Nullable(Int(0)),
    "use_sliding_window": Bool(), "rope_theta": Float(above=0), "rope_scaling": Nullable(ROPE),
    "rope_parameters": Nullable(ROPE), "rms_norm_eps": EPSILON, "attention_bias": Bool(), "mlp_bias": Bool(),
}, required=("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "max_position_embeddings"))

SCHEMAS = {"gpt2": GPT2, "llama": LLAMA, "mistral": LLAMA}
