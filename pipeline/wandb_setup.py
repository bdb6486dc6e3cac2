"""W&B mode, group and run name, decided before ``wandb.init``.

``logger.mode: auto`` does what W&B's own messages tell a user: ``WANDB_MODE`` wins, then
``WANDB_API_KEY``, then a stored login (``wandb login`` writes the API host into ~/.netrc, or
``$NETRC``); without any of them the run is offline and one line says how to go online. The
netrc file is only asked whether it has an entry for the host: the key itself is never read into
a variable that is printed or logged.
"""
from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping
from urllib.parse import urlparse

if TYPE_CHECKING:
    from hydra.conf import HydraConf

MODES = ("auto", "online", "offline", "disabled")
# WANDB_MODE values W&B accepts, and what they mean here
_ENV_MODES = {"online": "online", "run": "online", "offline": "offline", "dryrun": "offline",
              "disabled": "disabled"}


def _host(environ: Mapping[str, str]) -> str:
    base = environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    return urlparse(base).hostname or "api.wandb.ai"


def has_stored_login(environ: Mapping[str, str] | None = None) -> bool:
    """True when the netrc file holds an entry for the W&B host (what ``wandb login`` writes)."""
    environ = os.environ if environ is None else environ
    path = Path(environ.get("NETRC") or Path(environ.get("HOME") or Path.home()) / ".netrc")
    if not path.is_file():
        return False
    try:
        return netrc.netrc(str(path)).authenticators(_host(environ)) is not None
    except (netrc.NetrcParseError, OSError):  # unreadable or malformed: as if absent
        return False


def has_credentials(environ: Mapping[str, str] | None = None) -> bool:
    """An API key in the environment or a stored ``wandb login``."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("WANDB_API_KEY")) or has_stored_login(environ)


def resolve_mode(mode: str, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(mode for wandb.init, why). An explicit ``logger.mode`` is taken as written."""
    environ = os.environ if environ is None else environ
    if mode not in MODES:
        raise ValueError(f"logger.mode={mode!r}: expected one of {MODES}")
    if mode != "auto":
        return mode, f"logger.mode={mode}"
    env = (environ.get("WANDB_MODE") or "").strip().lower()
    if env:
        if env not in _ENV_MODES:
            raise ValueError(f"WANDB_MODE={env!r} (logger.mode=auto): expected one of {sorted(_ENV_MODES)}")
        return _ENV_MODES[env], f"WANDB_MODE={env}"
    if environ.get("WANDB_API_KEY"):
        return "online", "WANDB_API_KEY is set"
    if has_stored_login(environ):
        return "online", f"stored login for {_host(environ)} (wandb login)"
    return "offline", "no WANDB_MODE, WANDB_API_KEY or stored login"


def offline_line(run_dir: Path, why: str) -> str:
    return (f"[logger] W&B offline ({why}): the run is kept in {run_dir}/wandb; `wandb login` or "
            f"WANDB_MODE=online logs online, `wandb sync {run_dir}/wandb/offline-run-*` uploads this one")


def is_multirun(hydra_cfg: HydraConf) -> bool:
    try:
        from hydra.types import RunMode

        return hydra_cfg.mode == RunMode.MULTIRUN
    except Exception:
        return False


def sweep_group(sweep_dir: str) -> str:
    """A sweep's W&B group: its dir's name, with the experiment's where the dir is the default
    ``runs/<name>-sweep/<date>_<time>`` (conf/config.yaml), so every sweep has a group of its own."""
    p = Path(sweep_dir)
    return f"{p.parent.name}/{p.name}" if p.parent.name.endswith("-sweep") else p.name


def sweep_names(name: str, hydra_cfg: HydraConf) -> tuple[str, str | None]:
    """(run name, group) for one Hydra job. A ``-m`` sweep's jobs share a group named after the
    sweep dir and are named by their own overrides, as ``name:key=value,key=value``."""
    if not is_multirun(hydra_cfg):
        return name, None
    overrides = [o for o in hydra_cfg.overrides.task if not o.startswith(("hydra.", "+experiment="))]
    job_name = f"{name}:{','.join(overrides)}" if overrides else f"{name}:{hydra_cfg.job.num}"
    return job_name[:128], sweep_group(str(hydra_cfg.sweep.dir))
