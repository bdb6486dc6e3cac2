"""Trainer schema (values in conf/trainer/*.yaml). RL hyper-parameters (clip, grad clip,
mini-batches, token budget) live in the algorithm group; this is the optimiser and the runtime."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class OptimConfig:
    lr: float = MISSING
    betas: list[float] = field(default_factory=lambda: MISSING)
    weight_decay: float = MISSING
    eps: float = MISSING
    warmup_ratio: float = MISSING   # share of all optimiser steps spent warming up (Kevin: 0.03)


@dataclass
class LoraConfig:
    """peft's LoRA on the policy (pipeline/trainer/lora.py); verl's lora_rank, lora_alpha, target_modules."""
    rank: int = MISSING             # 0: off (full fine-tuning); r of the adapters otherwise
    alpha: float = MISSING          # the adapters' output is scaled by alpha / rank
    dropout: float = MISSING        # on the adapters' input, in every trainer forward
    target_modules: Any = MISSING   # all-linear | [module name suffixes] | a regex (peft's target_modules)


@dataclass
class TrainerConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    param_dtype: str = MISSING      # auto | bfloat16 | float32: compute dtype (auto: bf16 on GPU, fp32 on CPU)
    reduce_dtype: str = MISSING     # gradient reduction dtype
    gradient_checkpointing: bool = MISSING
    gradient_checkpointing_share: float = MISSING  # of the decoder layers (the first ones); 1.0: all
    attn_implementation: str = MISSING  # auto | sdpa | eager | flash_attention_2 | varlen (packed rows only)
    remove_padding: str = MISSING   # auto | true | false: packed micro-batches, no padding (auto: on GPU)
    liger: bool = MISSING           # Liger's Triton RMSNorm/SwiGLU/RoPE (CUDA, when liger-kernel is installed)
    logprob_chunk_tokens: int = MISSING  # >0: log-probs from hidden states in chunks (verl FusedLinearForPPO); 0: full logits
    compile_layers: bool = MISSING       # torch.compile each decoder layer before sharding it
    compile_head: bool = MISSING         # the chunked log-prob head's chunk math under torch.compile
    reshard_after_forward: bool = MISSING
    backend: str = MISSING          # auto | gloo | nccl (auto: nccl on GPU, gloo on CPU)
    weight_bucket_mb: float = MISSING  # weight export bucket size (object store, IPC, broadcast)
    export_dtype: str = MISSING     # auto | bfloat16 | float32: dtype of weights pushed to samplers
    seed: int = MISSING
    init_timeout_s: float = MISSING # process-group rendezvous timeout
