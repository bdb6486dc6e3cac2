"""The warm start a run asks for with ``model.warm_start=<experiment>`` (the laptop default:
``kernel_sft``): on first use, ``python -m pipeline.sft +experiment=<experiment>`` with the run's
profile, backend, task set and ``model.*`` overrides, its HF checkpoint cached under
``model.warm_start_dir/<key>``; later runs with the same inputs reuse it. The key hashes every
input of the SFT run (its config files, the corpus answers, the code that trains), so a changed
corpus or recipe builds a new one; the build is deterministic (fixed seeds, one trainer rank).

With ``sandbox.cache_dir`` set, the corpus answers of the run's tasks are then evaluated once
through the real sandbox, so their builds sit in the compile cache when the model writes them
(a cache hit is still a real evaluation: correctness and timing run every time).

``python -m pipeline.warm_start <the run's overrides>`` builds (or finds) the warm start and the
prebuild alone, without Ray or a trainer, so a run started later with the same overrides begins
at its first batch (the device scripts build it while other work still runs).
"""
from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.conf_files import CONF_DIR

if TYPE_CHECKING:
    from pipeline.config import Config
    from rewards.interface import SandboxConfig, RewardConfig

_ROOT = CONF_DIR.parent
_SOURCES = ("pipeline/sft.py", "pipeline/sft_data.py", "pipeline/trainer/sft.py",
            "pipeline/models/tiny.py", "conf/sft/default.yaml", "conf/model/tiny.yaml",
            "conf/trainer/fsdp2.yaml", "conf/algorithm/grpo_plus.yaml")


def sft_overrides(cfg: Config, profile: str, cli_overrides: list[str]) -> list[str]:
    """The ``pipeline.sft`` command line that builds this run's warm start."""
    name = str(cfg.model.warm_start)
    model = [o for o in cli_overrides if o.lstrip("+").startswith("model.")
             and not o.lstrip("+").startswith(("model.warm_start", "model.path"))]
    tasks = list(cfg.reward.task_ids)
    out = [f"+experiment={name}", f"profile={profile}", f"reward.backend={cfg.reward.backend}",
           f"reward.profile={cfg.reward.profile}", *model]
    if tasks:
        out += [f"reward.task_ids=[{','.join(tasks)}]", f"sft.task_ids=[{','.join(tasks)}]"]
    return out + [str(o) for o in cfg.model.warm_start_overrides]


def cache_key(cfg: Config, overrides: list[str]) -> str:
    from rewards.corpus import corpus_answers

    h = hashlib.sha256()
    h.update(json.dumps(overrides).encode())
    for rel in (*_SOURCES, f"conf/experiment/{cfg.model.warm_start}.yaml"):
        h.update(rel.encode() + b"\0" + (_ROOT / rel).read_bytes())
    for a in corpus_answers(str(cfg.reward.backend)):
        h.update(f"{a.task_id}\0{a.variant}\0{a.code}\0".encode())
    return h.hexdigest()[:16]


def ensure(cfg: Config, profile: str, cli_overrides: list[str]) -> Path:
    """The warm-started HF model directory, built first when the cache has none; with
    ``sandbox.cache_dir`` set, the corpus answers are prebuilt into it once per cache dir."""
    overrides = sft_overrides(cfg, profile, cli_overrides)
    root = Path(os.path.expanduser(str(cfg.model.warm_start_dir))) / cache_key(cfg, overrides)
    model_dir = root / "final" / "model"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:  # two runs starting at once build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (model_dir / "config.json").is_file():
            print(f"[pipeline] warm start: {model_dir} (cached)", file=sys.stderr, flush=True)
        else:
            build(overrides, root)
        cache = cfg.sandbox.cache_dir
        marker = root / "prebuilt.json"
        if cache and cfg.env == "kernel":
            from sandbox.build import BUILD_RECIPE, build_tools

            # the cache dir with what the build keys hash besides the code (recipe, ninja, compiler):
            # a new ninja makes new keys, and the corpus answers must be built again under them
            stamp = f"{cache} recipe={BUILD_RECIPE} {build_tools()}"
            done = json.loads(marker.read_text()) if marker.is_file() else []
            if stamp not in done or not Path(cache).is_dir():
                prebuild(cfg.reward, cfg.sandbox)
                marker.write_text(json.dumps(sorted(set(done) | {stamp})))
    return model_dir


def build(overrides: list[str], root: Path) -> None:
    model_dir = root / "final" / "model"
    cmd = [sys.executable, "-m", "pipeline.sft", *overrides, f"sft.output_dir={root / 'final'}",
           f"hydra.run.dir={root / 'run'}", "logger.mode=disabled", "pipeline.progress=false"]
    print(f"[pipeline] warm start: building it once ({' '.join(cmd[1:])}); cached in {root}",
          file=sys.stderr, flush=True)
    t0 = time.time()
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(cmd, cwd=_ROOT, env=env)
    if done.returncode != 0 or not (model_dir / "config.json").is_file():
        raise RuntimeError(f"warm start: `{' '.join(cmd)}` failed (exit {done.returncode}); "
                           f"its log is in {root / 'run'}")
    print(f"[pipeline] warm start built in {time.time() - t0:.0f} s: {model_dir}", file=sys.stderr, flush=True)


def prebuild(reward_cfg: RewardConfig, sandbox_cfg: SandboxConfig) -> dict[str, int]:
    """Evaluate every corpus answer of the run's training tasks once (their builds land in
    ``sandbox.cache_dir``); returns the count of each verdict."""
    from pipeline.sft_data import answer_text  # the code block exactly as the warm start writes it
    from rewards.corpus import corpus_answers
    from rewards.env import KernelEnv
    from rewards.interface import TaskRef
    from sandbox.pool import SandboxPool

    pool = SandboxPool(sandbox_cfg)
    env = KernelEnv(reward_cfg, pool)
    ids = [t.task_id for t in env.tasks("train")]
    answers = corpus_answers(env.backend, ids)

    async def all_of() -> list[Any]:
        try:
            out = await asyncio.gather(*[
                env.score(TaskRef(a.task_id, env.task(a.task_id)), answer_text(a.code, "Summary."))
                for a in answers])
            if env.backend == "cuda":
                # these builds asked for the precompiled headers of their flags; closing the pool now
                # would cancel that build, and every new answer of the run's first steps would then
                # build without it (the H200, 2026-12-05: cold builds of ~88 s in such a run's first
                # step, where bench.sandbox measured ~22 s with the headers)
                t0 = time.time()
                await pool.headers_ready()
                print(f"[pipeline] warm start: precompiled headers ready in {time.time() - t0:.0f} s",
                      file=sys.stderr, flush=True)
            return out
        finally:
            await env.aclose()

    t0 = time.time()
    outcomes = asyncio.run(all_of())
    counts: dict[str, int] = {}
    for o in outcomes:
        kind = "correct" if o.correct else (o.error_kind or "incorrect")
        counts[kind] = counts.get(kind, 0) + 1
    print(f"[pipeline] warm start: {len(answers)} corpus answers of {len(ids)} tasks evaluated into the "
          f"compile cache in {time.time() - t0:.0f} s: {counts}", file=sys.stderr, flush=True)
    return counts


def main() -> None:
    """``python -m pipeline.warm_start <overrides of pipeline.main>``: prints the model dir."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig

    from pipeline.config import ConfigError, check, check_required, register, resolved_profile
    from pipeline.conf_files import CONF_PATH

    register()

    @hydra.main(config_path=CONF_PATH, config_name="config", version_base="1.3")
    def _entry(cfg: DictConfig) -> None:
        try:
            check_required(cfg)  # as pipeline.main does, before anything reads model.path
            if not (cfg.model.warm_start and cfg.model.path == "tiny"):
                raise ConfigError(f"no warm start to build: model.warm_start={cfg.model.warm_start}, "
                                  f"model.path={cfg.model.path} (a warm start is for model.path=tiny)")
            check(cfg)
        except ConfigError as e:
            print(f"[pipeline] {e}", file=sys.stderr, flush=True)
            sys.exit(2)
        if cfg.sandbox.cache_dir:
            cfg.sandbox.cache_dir = os.path.expanduser(str(cfg.sandbox.cache_dir))
        print(ensure(cfg, resolved_profile(cfg), list(HydraConfig.get().overrides.task)), flush=True)

    _entry()


if __name__ == "__main__":
    main()
