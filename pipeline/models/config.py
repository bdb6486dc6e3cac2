"""Model schema (values in conf/model/*.yaml)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


@dataclass
class TinyArchConfig:
    """A small random-initialised Qwen2: a real architecture that runs on a laptop CPU."""

    vocab_size: int = MISSING          # BPE vocabulary trained in code (special tokens included)
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    num_hidden_layers: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    max_position_embeddings: int = MISSING
    tie_word_embeddings: bool = MISSING
    seed: int = MISSING                # weights are a pure function of the seed
    tokenizer_corpus: Optional[str] = MISSING  # null | cpu | cuda | triton: BPE merges also from that
                                               # backend's kernel prompts and answer corpus


@dataclass
class ModelConfig:
    path: str = MISSING                # "tiny", or a local HF checkpoint directory
    dtype: str = MISSING               # auto | float32 | bfloat16 | float16 (auto: the checkpoint's)
    trust_remote_code: bool = MISSING
    tiny: TinyArchConfig = field(default_factory=TinyArchConfig)
    warm_start: Optional[str] = MISSING  # an SFT experiment run first, whose model replaces path (null: none)
    warm_start_dir: str = MISSING        # where warm starts are cached, one directory per input hash
    warm_start_overrides: list[str] = field(default_factory=lambda: MISSING)  # extra pipeline.sft overrides
