"""Checkpoints: ``<run_dir>/<checkpoint.dir>/step_<N>/`` holding ``model/`` (HF format, written
by the trainer through save_pretrained), ``optimizer.pt`` (full optimizer + scheduler state) and
``loop.pt`` (step, data cursor, RNG states, and, in one_off mode, the batch already generated for
the next step, so that resuming neither loses nor repeats a sample).

Written into a hidden temporary directory, then renamed: a crash mid-write leaves no checkpoint
that ``latest`` would pick up.
"""
from __future__ import annotations

import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

_NAME = re.compile(r"^step_(\d+)$")


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and (p / "loop.pt").exists():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the message names the path, and earlier ones are intact."""


def save(root: str | Path, step: int, trainer: Any, loop_state: dict[str, Any], keep_last: int) -> Path:
    """``trainer.save(dir)`` writes model/ and optimizer.pt; loop.pt last, then the rename.

    Any failure (unwritable run dir, full disk, a trainer rank that dies mid-write) removes the
    partial directory and raises :class:`CheckpointError`; the checkpoints already there are
    untouched, so ``resume=auto`` still finds the previous one."""
    root = Path(root)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        trainer.save(str(tmp))
        with open(tmp / "loop.pt", "wb") as f:
            pickle.dump({"step": step, "rng": rng_state(), **loop_state}, f)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():  # the same step again: the old copy goes only once the new one is in place
            old = root / f".old_step_{step:06d}_{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        prev = latest(root) if root.is_dir() else None
        raise CheckpointError(
            f"checkpoint of step {step} could not be written to {final} ({type(e).__name__}: {e}); "
            f"{'the previous one, ' + str(prev) + ', is intact' if prev else 'no earlier checkpoint exists'}. "
            "Check that checkpoint.dir under the run dir is writable and has space.") from e
    if keep_last > 0:
        for _, old_ckpt in list_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old_ckpt, ignore_errors=True)
    return final


def load_loop_state(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not (path / "loop.pt").exists():
        raise FileNotFoundError(f"resume={path}: not a checkpoint directory (expected "
                                f"{path}/loop.pt, model/ and optimizer.pt)")
    with open(path / "loop.pt", "rb") as f:
        return pickle.load(f)


def resolve_resume(resume: str, root: str | Path) -> Path | None:
    """``resume``: never | auto or force (the latest under root, if any) | a checkpoint directory."""
    if resume in ("never", "", None):
        return None
    if resume in ("auto", "force"):
        return latest(root)
    path = Path(resume)
    load_loop_state(path)  # fails naming the path when it is not a checkpoint
    return path


# Keys that may change between a run and its continuation: where output goes, how it is shown,
# how long to run. Anything else changes what is trained, so resume=auto refuses it.
RESUME_MAY_DIFFER = ("resume", "logger", "pipeline.progress", "pipeline.heartbeat_s", "pipeline.steps",
                     "checkpoint.every", "checkpoint.keep_last", "checkpoint.at_end",
                     "resources.placement_timeout_s", "resources.ray", "evaluate", "profile")


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def config_diff(saved: dict[str, Any], new: dict[str, Any],
                may_differ: tuple[str, ...] = RESUME_MAY_DIFFER) -> list[str]:
    """``key: saved -> new`` for every leaf that differs, outside ``may_differ`` (prefixes)."""
    a, b = flatten(saved), flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if any(key == p or key.startswith(p + ".") for p in may_differ):
            continue
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            out.append(f"{key}: {a.get(key, '<absent>')!r} -> {b.get(key, '<absent>')!r}")
    return out


class ResumeMismatch(ValueError):
    """resume=auto found a checkpoint of a run configured differently."""


def check_resume_config(resume: str, run_dir: str | Path, new: dict[str, Any],
                        dir_key: str = "hydra.run.dir") -> list[str]:
    """Compare the run dir's saved config.json with the new one before continuing its checkpoint.

    ``auto`` raises :class:`ResumeMismatch` listing the differing keys; ``force`` returns them
    (the caller prints them and continues). A run dir without config.json compares as equal."""
    import json

    path = Path(run_dir) / "config.json"
    if resume not in ("auto", "force") or not path.exists():
        return []
    diff = config_diff(json.loads(path.read_text()), json.loads(json.dumps(new, default=str)))
    if diff and resume == "auto":
        shown = "\n  ".join(diff[:20]) + (f"\n  ... {len(diff) - 20} more" if len(diff) > 20 else "")
        raise ResumeMismatch(
            f"resume=auto: {run_dir} holds a checkpoint of a run with a different config, so it is "
            f"not continued:\n  {shown}\nStart a fresh run in another dir (name=<new name> or "
            f"{dir_key}=<dir>), overwrite this one (resume=never), or continue it with the new "
            f"values anyway (resume=force).")
    return diff
