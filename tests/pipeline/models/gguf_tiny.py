"""A tiny Qwen2 GGUF written in the test with the gguf package (F32 tensors, the tiny model's
byte-level BPE tokenizer): what pipeline.models.fetch converts, without a network."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def write_tiny_gguf(path: Path) -> Any:
    """Write the tiny Qwen2 (pipeline.models.tiny) as a GGUF at ``path``; returns the HF model."""
    import gguf

    from pipeline.models.tiny import build_tiny, default_tiny_arch

    arch = default_tiny_arch()
    model, tok = build_tiny(arch)
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny-qwen2")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]))
    w.add_file_type(0)
    data = json.loads(tok.backend_tokenizer.to_str())
    vocab = data["model"]["vocab"]
    added = {t["content"]: t["id"] for t in data["added_tokens"]}
    tokens = [""] * cfg.vocab_size
    types = [gguf.TokenType.UNUSED] * cfg.vocab_size
    for t, i in vocab.items():
        tokens[i], types[i] = t, gguf.TokenType.NORMAL
    for t, i in added.items():
        tokens[i], types[i] = t, gguf.TokenType.CONTROL
    for i, t in enumerate(tokens):
        if not t:
            tokens[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
                 "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
                 "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
                 "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
                 "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
                 "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    for i in range(cfg.num_hidden_layers):
        for k, v in per_layer.items():
            names[f"model.layers.{i}.{k}"] = f"blk.{i}.{v}"
    for hf_name, arr in sd.items():
        w.add_tensor(names[hf_name], np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model
