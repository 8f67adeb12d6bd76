"""Hugging Face interchange: read GPT-2 and Llama-family checkpoints into attngpt, write attngpt models
in the Hugging Face layout, build the equal transformers model in memory. transformers itself is needed
only by `to_transformers`; reading and writing use safetensors and JSON (huggingface_hub for hub ids).

    config_map.py          config.json <-> ModelConfig (what is supported, what is refused and why)
    gpt2_weights.py        GPT2LMHeadModel names <-> attngpt names (Conv1D transposes)
    llama_weights.py       LlamaForCausalLM names <-> attngpt names (RoPE row permutation, fused q|k|v, gate|up)
    source.py              a folder or a hub id; config.json; safetensors files (sharded too), checked
    load.py                folder -> GPT
    export.py              GPT -> HF tensors + config; atomic folder writing
    transformers_model.py  GPT -> transformers model in memory
"""
