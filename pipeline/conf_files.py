"""Read one config group from ``conf/`` outside the Hydra entry point (tests, benches, CLIs)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def load_group(schema: type, group: str, name: str, overrides: list[str] | None = None) -> Any:
    """``conf/<group>/<name>.yaml`` merged onto ``schema``, then dotted ``overrides``: a wrong key
    or type fails with OmegaConf's message naming it."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.load(CONF_DIR / group / f"{name}.yaml"))
    if overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    return cfg
