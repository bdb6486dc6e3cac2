from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from pipeline.algorithms import AlgorithmConfig

CONF = Path(__file__).resolve().parents[3] / "conf" / "algorithm"


def algo(name: str = "grpo_plus", **overrides: Any) -> AlgorithmConfig:
    """conf/algorithm/<name>.yaml on the schema, overrides applied, as the dataclass."""
    cfg = OmegaConf.merge(OmegaConf.structured(AlgorithmConfig), OmegaConf.load(CONF / f"{name}.yaml"))
    for k, v in overrides.items():
        OmegaConf.update(cfg, k, v, merge=False)
    return OmegaConf.to_object(cfg)
