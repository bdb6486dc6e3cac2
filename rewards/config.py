"""Schemas of the environments' configurations (the kernel env's ``reward`` group and the toy
env's ``toy`` group). Types only: values live in conf/reward/<name>.yaml and conf/toy/default.yaml."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

from pipeline.conf_files import CONF_DIR as _CONF  # noqa: E402  (conf/ in a checkout, pipeline/conf installed)

CONF_DIR = _CONF / "reward"
BACKENDS = ("cpu", "triton", "cuda")
EXCESSIVE_SPEEDUP_POLICIES = ("cap", "zero")


@dataclass
class RulesConfig:
    enabled: list[str] = MISSING                 # rule names (rewards.rules.RULES)
    allowed_torch_calls: list[str] = MISSING     # dotted names in ModelNew.forward; "ns.*" for a namespace
    allowed_tensor_methods: list[str] = MISSING  # tensor methods allowed in forward (contiguous, view, ...)
    allowed_extension_calls: list[str] = MISSING  # torch::/at:: calls allowed in C++/CUDA; "ns::*" for a namespace


@dataclass
class RewardConfig:
    backend: str = MISSING              # cpu | triton | cuda
    tasks: str = MISSING                # "builtin" or the path of a KernelBench-style checkout
    levels: list[int] = MISSING
    profile: str = MISSING              # task sizes: full | cpu
    skip_invalid_tasks: bool = MISSING  # warn and skip bad task files instead of failing
    max_tasks: int | None = MISSING     # keep only the first N tasks (null: all)
    task_ids: list[str] = field(default_factory=lambda: MISSING)  # keep only these tasks ([]: all)
    sizes: list[str] = field(default_factory=lambda: MISSING)  # "TASK_OR_PATTERN:NAME=INT,...": sizes set by name (rewards/tasks/sizes.py)
    holdout_frac: float = MISSING
    split_seed: int = MISSING
    correct_weight: float = MISSING     # score = correct_weight * correct + speedup_weight * speedup * correct
    speedup_weight: float = MISSING
    speedup_cap: float | None = MISSING  # speedup credited at most this (null: no cap)
    excessive_speedup_policy: str = MISSING  # speedup the sandbox flagged as excessive: cap | zero
    feedback_log_chars: int = MISSING   # compiler / runtime log kept in feedback
    verdict_text_chars: int = MISSING   # sandbox error / log tail kept in the verdict (after secrets are scrubbed)
    max_answer_chars: int = MISSING     # longer responses are rejected as too_long
    max_summary_chars: int = MISSING    # summary kept for later turns
    worked_example: bool = MISSING      # the cuda/triton system prompt shows a worked answer (rewards/prompts.py)
    rules: RulesConfig = field(default_factory=RulesConfig)


@dataclass
class ToyEnvConfig:
    """rewards.toy.ToyEnv (env=toy): a reward a tiny random model learns in a few steps."""

    target: str = MISSING
    n_tasks: int = MISSING
    n_holdout: int = MISSING
    delay_s: float = MISSING


def _load_group_yaml(name: str, seen: tuple[str, ...] = ()) -> Any:
    """A group file with its ``defaults`` list resolved (same-group parents, as Hydra does)."""
    path = CONF_DIR / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"reward config {name!r}: {path} not found; available: "
                                f"{', '.join(sorted(p.stem for p in CONF_DIR.glob('*.yaml')))}")
    if name in seen:
        raise ValueError(f"reward config {name!r}: defaults loop {' -> '.join(seen + (name,))}")
    node = OmegaConf.load(path)
    defaults = node.pop("defaults", [])
    parts = []
    for d in defaults:
        parts.append(node if d == "_self_" else _load_group_yaml(str(d), seen + (name,)))
    if "_self_" not in defaults:
        parts.append(node)
    return OmegaConf.merge(*parts) if parts else node


def load_reward_config(name: str = "kernel", dotlist: list[str] | None = None, **overrides: Any) -> RewardConfig:
    """``conf/reward/<name>.yaml`` merged onto the schema, then ``dotlist`` (``["levels=[2]"]``,
    values parsed as YAML), then ``overrides`` (Python values; dotted keys allowed)."""
    merged = OmegaConf.merge(OmegaConf.structured(RewardConfig), _load_group_yaml(name),
                             OmegaConf.from_dotlist(list(dotlist or [])),
                             OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items() if "." in k]),
                             OmegaConf.create({k: v for k, v in overrides.items() if "." not in k}))
    cfg: RewardConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    validate(cfg)
    return cfg


def validate(cfg: RewardConfig) -> None:
    """Semantic checks; each message names the key (``reward.<key>``) and what was expected."""
    from rewards.rules import RULES
    from rewards.tasks import PROFILES, TaskError
    from rewards.tasks.sizes import parse_entry

    errors = []
    if cfg.backend not in BACKENDS:
        errors.append(f"reward.backend={cfg.backend!r}: expected one of {BACKENDS}")
    if cfg.tasks != "builtin" and not Path(cfg.tasks).is_dir():
        errors.append(f"reward.tasks={cfg.tasks!r}: expected 'builtin' or a KernelBench checkout directory")
    if cfg.profile not in PROFILES:
        errors.append(f"reward.profile={cfg.profile!r}: expected one of {PROFILES}")
    if not cfg.levels or any(lv < 1 for lv in cfg.levels):
        errors.append(f"reward.levels={list(cfg.levels)}: expected a non-empty list of levels >= 1")
    if not 0.0 <= cfg.holdout_frac < 1.0:
        errors.append(f"reward.holdout_frac={cfg.holdout_frac}: expected 0 <= holdout_frac < 1")
    if cfg.max_tasks is not None and cfg.max_tasks < 1:
        errors.append(f"reward.max_tasks={cfg.max_tasks}: expected null or >= 1")
    if cfg.correct_weight < 0 or cfg.speedup_weight < 0:
        errors.append("reward.correct_weight / reward.speedup_weight: expected >= 0")
    if cfg.speedup_cap is not None and cfg.speedup_cap <= 0:
        errors.append(f"reward.speedup_cap={cfg.speedup_cap}: expected null or > 0")
    if cfg.excessive_speedup_policy not in EXCESSIVE_SPEEDUP_POLICIES:
        errors.append(f"reward.excessive_speedup_policy={cfg.excessive_speedup_policy!r}: expected one of "
                      f"{EXCESSIVE_SPEEDUP_POLICIES}")
    for key in ("feedback_log_chars", "verdict_text_chars", "max_answer_chars", "max_summary_chars"):
        if getattr(cfg, key) < 1:
            errors.append(f"reward.{key}={getattr(cfg, key)}: expected >= 1")
    for entry in cfg.sizes:
        try:
            parse_entry(entry)
        except TaskError as e:
            errors.append(str(e))
    unknown = [r for r in cfg.rules.enabled if r not in RULES]
    if unknown:
        errors.append(f"reward.rules.enabled has unknown rule(s) {unknown}; known: {', '.join(RULES)}")
    if errors:
        raise ValueError("; ".join(errors))
