"""Read one config group from ``conf/`` outside the Hydra entry point (tests, benches, CLIs)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

def _conf_dir() -> Path:
    """The configs: ``conf/`` of a source checkout (editable install), else the copy an installed
    wheel carries as package data (``pipeline/conf``)."""
    here = Path(__file__).resolve().parent
    for d in (here.parent / "conf", here / "conf"):
        if (d / "config.yaml").is_file():
            return d
    return here.parent / "conf"


CONF_DIR = _conf_dir()
CONF_PATH = str(CONF_DIR)  # absolute: what every @hydra.main is given


def load_group(schema: type, group: str, name: str, overrides: list[str] | None = None) -> Any:
    """``conf/<group>/<name>.yaml`` merged onto ``schema``, then dotted ``overrides``: a wrong key
    or type fails with OmegaConf's message naming it."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.load(CONF_DIR / group / f"{name}.yaml"))
    if overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    return cfg
