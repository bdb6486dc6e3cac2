"""Policy models: local HF checkpoints, or a tiny random Qwen2 with a tokenizer built in code."""
from pipeline.models.config import ModelConfig, TinyArchConfig
from pipeline.models.load import (check_checkpoint_dir, load_model_and_tokenizer, load_model_config,
                                  load_tokenizer)
from pipeline.models.tiny import build_tiny

__all__ = ["ModelConfig", "TinyArchConfig", "build_tiny", "check_checkpoint_dir",
           "load_model_and_tokenizer", "load_model_config", "load_tokenizer"]
