import os
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from pipeline.models import load_model_and_tokenizer, load_model_config
from pipeline.rollout_config import load_rollout_config

CONF = Path(__file__).resolve().parents[2] / "conf"


def save_tiny_checkpoint(directory: str, arch: Any | None = None) -> str:
    """The tiny model + tokenizer as an ordinary HF checkpoint directory (what ``model=local`` and
    vLLM load), for tests of the path a real checkpoint takes; returns ``directory``."""
    from pipeline.models.tiny import build_tiny, default_tiny_arch

    if arch is None:
        arch = default_tiny_arch()
    model, tokenizer = build_tiny(arch)
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def group(schema: type, name: str, **overrides: Any) -> Any:
    """conf/<name>.yaml onto its schema, dotted overrides applied, as the dataclass object."""
    cfg = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.load(CONF / f"{name}.yaml"))
    for k, v in overrides.items():
        OmegaConf.update(cfg, k, v, merge=False)
    return OmegaConf.to_object(cfg)


def rollout_cfg(**overrides: Any):
    """conf/rollout/hf.yaml shrunk for tests (tiny responses, few trajectories), then overrides."""
    base = {"n_trajectories": 2, "turns": 2, "max_response_length": 12,
            "response_length_schedule": [], "max_prompt_length": 1024,
            "gen_timeout_s": 120, "score_timeout_s": 60, "engine.hf.batch_wait_s": 0.01}
    base.update(overrides)
    return load_rollout_config("hf", [f"{k}={v}" for k, v in base.items()])


@pytest.fixture(scope="session")
def tiny():
    """(model config, model, tokenizer): one tiny model for the session."""
    cfg = load_model_config("tiny")
    model, tokenizer = load_model_and_tokenizer(cfg)
    return cfg, model, tokenizer


@pytest.fixture(scope="session")
def ray_sampling(ray_local):
    """The session's local Ray (tests/conftest.py)."""
    return ray_local
