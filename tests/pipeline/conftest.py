from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"


def group(schema: type, name: str, **overrides: Any) -> Any:
    """conf/<name>.yaml onto its schema, dotted overrides applied, as the dataclass object."""
    cfg = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.load(CONF / f"{name}.yaml"))
    for k, v in overrides.items():
        OmegaConf.update(cfg, k, v, merge=False)
    return OmegaConf.to_object(cfg)
