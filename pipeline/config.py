"""Root configuration: one typed tree composed by Hydra from conf/ (defaults live only there).

The root dataclass composes every group's schema and is registered in Hydra's ConfigStore as
``config_schema``; ``conf/config.yaml`` lists it first in its defaults, so a key that no schema
declares, or a value of the wrong type, stops the run at composition with Hydra's message naming
the full key. :func:`check` adds the semantic checks a type cannot express.

Sizes that differ between a laptop and a cluster are written ``${sized:laptop_value,full_value}``
in the experiment files. ``profile=auto`` picks ``laptop`` when no GPU is visible and
``model.path=tiny`` (the embedded default), ``full`` otherwise; ``profile=laptop|full`` forces it.
A value given on the command line replaces the interpolation, so overrides always win.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from pipeline.algorithms.config import AlgorithmConfig
from pipeline.checkpoint_config import CheckpointConfig
from pipeline.evaluate_config import EvaluateConfig
from pipeline.logger_config import LoggerConfig
from pipeline.loop_config import PipelineConfig
from pipeline.models.config import ModelConfig
from pipeline.resources_config import ResourcesConfig
from pipeline.rollout_config import RolloutConfig
from pipeline.sft_config import SftConfig
from pipeline.trainer.config import TrainerConfig
from rewards.interface import ENVS, SandboxConfig, RewardConfig, ToyEnvConfig, check_env_config

PROFILES = ("auto", "laptop", "full")


@dataclass
class Config:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    toy: ToyEnvConfig = field(default_factory=ToyEnvConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    env: str = MISSING          # kernel | toy: which RewardEnv the samplers build
    name: str = MISSING         # run name (run dir, W&B run)
    profile: str = MISSING      # auto | laptop | full
    resume: str = MISSING       # auto | force | never | <checkpoint dir> (pipeline/checkpoint.py)


class ConfigError(ValueError):
    """A bad configuration; the message names every bad key (the entry point prints it alone)."""


RESUME_MODES = ("auto", "never", "force")


def check_required(cfg: Config) -> None:
    """Values without a default that the run needs, asked before anything reads them (OmegaConf
    would otherwise stop at the first read with a traceback)."""
    if OmegaConf.is_missing(cfg.model, "path"):
        raise ConfigError("invalid configuration:\n  model.path is not set: model=local needs "
                          "model.path=<a local Hugging Face checkpoint dir> (config.json, weights, "
                          "tokenizer) or a Hugging Face Hub id (e.g. Qwen/Qwen2.5-0.5B-Instruct)")


def resolved_profile(root: Config) -> str:
    """``auto`` follows the hardware: ``laptop`` sizes where no GPU is visible (any model), ``full``
    where one is."""
    p = root.profile
    if p not in PROFILES:
        raise ConfigError(f"invalid configuration:\n  profile={p!r}: expected one of {PROFILES}")
    if p != "auto":
        return p
    import torch

    return "laptop" if not torch.cuda.is_available() else "full"


def preflight(cfg: DictConfig) -> Config:
    """Everything that can be checked before Ray or a model starts, in one ``invalid
    configuration`` block (ConfigError): required values, the profile, interpolations, every
    group's checks, the selected engine's dependencies, W&B credentials for an online run; a Hub
    id in ``model.path`` is fetched (or found in the local cache) here. Returns ``cfg`` resolved,
    typed as what it is from here on: Hydra's typed DictConfig of :class:`Config` (kept a
    DictConfig because groups the run does not use may hold MISSING values, e.g.
    ``rollout.engine.vllm`` under the hf engine)."""
    conf = cast(Config, cfg)
    check_required(conf)
    resolved_profile(conf)
    from omegaconf.errors import OmegaConfBaseException

    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(f"invalid configuration:\n  {e}".split("\n    full_key")[0]) from None
    check(conf)
    return conf


def _sized(laptop: Any, full: Any, *, _root_: Config) -> Any:
    return laptop if resolved_profile(_root_) == "laptop" else full


def eval_dir(checkpoint: Any, name: Any) -> str:
    """Where ``python -m pipeline.evaluate`` writes (conf/eval.yaml): beside a run's checkpoints,
    ``<run>/eval/step_N``, never in the run's own files; without a checkpoint ``runs/<name>-eval``."""
    from pathlib import Path

    if checkpoint in (None, "", "None"):
        return f"runs/{name}-eval"
    p = Path(os.path.expanduser(str(checkpoint)))
    p = p.parent if p.name == "model" else p  # <ckpt>/model given for the checkpoint itself
    if (p / "loop.pt").exists() or p.name.startswith("step_"):  # <run>/<checkpoint.dir>/step_N
        return str(p.parent.parent / "eval" / p.name)
    return f"runs/{name}-eval/{p.name or 'model'}"  # an HF model dir: not a run of ours


def _env_list(var: str) -> list[str]:
    """``${env_list:WANDB_TAGS}``: a comma-separated environment variable as a list ([] unset)."""
    return [x.strip() for x in os.environ.get(var, "").split(",") if x.strip()]


def register() -> None:
    """Schema into the ConfigStore, the ``${sized:...}``, ``${eval_dir:...}`` and
    ``${env_list:...}`` resolvers into OmegaConf (idempotent)."""
    if not OmegaConf.has_resolver("sized"):
        OmegaConf.register_new_resolver("sized", _sized)
    if not OmegaConf.has_resolver("eval_dir"):
        OmegaConf.register_new_resolver("eval_dir", eval_dir)
    if not OmegaConf.has_resolver("env_list"):
        OmegaConf.register_new_resolver("env_list", _env_list)
    ConfigStore.instance().store(name="config_schema", node=Config)


# Keys renamed since they shipped: an old name on the command line gets its new one in one line
# (Hydra's own message says only that the key is not in the schema).
RENAMED_KEYS = {"pipeline.weight_sync": "pipeline.weight_push",
                "pipeline.weight_sync_timeout_s": "pipeline.weight_push_timeout_s",
                "pipeline.initial_weight_sync": "pipeline.initial_weight_push",
                "pipeline.verify_weight_sync": "pipeline.verify_weight_push",
                "rollout.eval_timeout_s": "rollout.score_timeout_s"}


def _renamed(key: str) -> str:
    return f"{key}: renamed {RENAMED_KEYS[key]} (CHANGELOG.md)"


def renamed_overrides(argv: list[str]) -> list[str]:
    """One message per command-line override that names a renamed key."""
    keys = (arg.lstrip("+~").split("=", 1)[0] for arg in argv)
    return [_renamed(key) for key in keys if key in RENAMED_KEYS]


def unknown_keys(schema: DictConfig, cfg: DictConfig, prefix: str = "") -> list[str]:
    """Keys of ``cfg`` that the schema does not declare. Hydra's ``+key=value`` adds a key even to
    a typed tree, so a misspelt ``+sandbox.timout=3`` would otherwise be ignored in silence."""
    found = []
    for key in cfg.keys():
        name = f"{prefix}{key}"
        if key not in schema.keys():  # `in` alone is False for a MISSING value
            found.append(name)
            continue
        sub, node = schema._get_node(key), cfg._get_node(key)
        if (isinstance(sub, DictConfig) and isinstance(node, DictConfig) and not sub._is_missing()
                and not node._is_missing() and sub._metadata.object_type not in (None, dict)):
            found += unknown_keys(sub, node, name + ".")
    return found


def check(cfg: Config) -> None:
    """Semantic checks across groups; each message names the keys."""
    errors = [_renamed(key) if key in RENAMED_KEYS else
              f"{key}: no such key in the schema (pipeline/config.py); check its spelling or group"
              for key in unknown_keys(OmegaConf.structured(Config), cfg)]
    from pipeline.staleness import POLICIES, resolve_staleness

    try:
        resolve_staleness(cfg.pipeline.mode, cfg.pipeline.max_staleness)
    except ValueError as e:
        errors.append(str(e))
    if cfg.pipeline.staleness_policy not in POLICIES:
        errors.append(f"pipeline.staleness_policy={cfg.pipeline.staleness_policy!r}: expected one of {POLICIES}")
    if cfg.pipeline.steps < 1:
        errors.append(f"pipeline.steps={cfg.pipeline.steps}: expected >= 1")
    if cfg.pipeline.max_trainer_restarts < 0:
        errors.append(f"pipeline.max_trainer_restarts={cfg.pipeline.max_trainer_restarts}: expected >= 0 "
                      "(0: a lost trainer stops the run with the resume line)")
    if cfg.pipeline.tasks_per_batch < 1:
        errors.append(f"pipeline.tasks_per_batch={cfg.pipeline.tasks_per_batch}: expected >= 1")
    if cfg.rollout.turns < 1:
        errors.append(f"rollout.turns={cfg.rollout.turns}: expected >= 1")
    if cfg.rollout.n_trajectories < 1:
        errors.append(f"rollout.n_trajectories={cfg.rollout.n_trajectories}: expected >= 1")
    if cfg.rollout.max_pending_scores < 0:
        errors.append(f"rollout.max_pending_scores={cfg.rollout.max_pending_scores}: expected >= 0 (0: no back pressure)")
    a = cfg.algorithm
    if a.clip_ratio_high < a.clip_ratio_low:
        errors.append(f"algorithm.clip_ratio_high={a.clip_ratio_high} < algorithm.clip_ratio_low="
                      f"{a.clip_ratio_low}: the upper clip must be at least the lower one")
    if a.ppo_mini_batches < 1:
        errors.append(f"algorithm.ppo_mini_batches={a.ppo_mini_batches}: expected >= 1")
    if a.micro_batch_tokens < 1:
        errors.append(f"algorithm.micro_batch_tokens={a.micro_batch_tokens}: expected >= 1")
    engine = cfg.rollout.engine
    if engine.type == "vllm" and cfg.resources.sampler.gpus > 0 and \
            engine.vllm.tensor_parallel_size != cfg.resources.sampler.gpus_per_worker:
        errors.append(f"rollout.engine.vllm.tensor_parallel_size={engine.vllm.tensor_parallel_size} but "
                      f"resources.sampler.gpus_per_worker={cfg.resources.sampler.gpus_per_worker}: each "
                      "sampler worker's engine spans exactly its GPUs; set only "
                      "resources.sampler.gpus_per_worker (the engine's size follows it)")
    if cfg.env not in ENVS:
        errors.append(f"env={cfg.env!r}: expected one of {ENVS}")
    if cfg.trainer.optim.lr <= 0:
        errors.append(f"trainer.optim.lr={cfg.trainer.optim.lr}: expected > 0")
    if not 0 < cfg.trainer.gradient_checkpointing_share <= 1:
        errors.append(f"trainer.gradient_checkpointing_share={cfg.trainer.gradient_checkpointing_share}: "
                      "expected a share of the decoder layers in (0, 1]")
    if not 0 <= cfg.trainer.optim.warmup_ratio < 1:
        errors.append(f"trainer.optim.warmup_ratio={cfg.trainer.optim.warmup_ratio}: expected in [0, 1)")
    # each group's own checks, gathered so one start reports every bad key at once
    from pipeline.algorithms.config import check_algorithm_config

    from pipeline.resources import check_builds

    group_checks: list[tuple[Callable[[Any], None], Any]] = [(check_algorithm_config, a), (_check_model_path, cfg.model),
                                           (_check_local_gpus, cfg.resources), (check_builds, cfg.resources)]
    if cfg.env in ENVS:
        group_checks.append((functools.partial(check_env_config, cfg.env), cfg.reward))
    for fn, node in group_checks:
        try:
            fn(node)
        except (ValueError, FileNotFoundError) as e:
            errors.append(str(e))
    from pipeline.trainer.lora import check as check_lora

    errors += check_lora(cfg.trainer.lora, cfg.model)  # after model.path's check: a Hub id is local by now
    if cfg.resume not in RESUME_MODES and not os.path.isdir(os.path.expanduser(str(cfg.resume))):
        errors.append(f"resume={cfg.resume!r}: expected one of {RESUME_MODES} or a checkpoint directory")
    errors += _engine_errors(cfg) + _logger_errors(cfg)
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))


def _check_model_path(model: ModelConfig) -> None:
    """A local checkpoint dir, ``tiny``, or a Hub id (fetched, or found in the local cache: the
    path then becomes the local snapshot's)."""
    if model.path == "tiny":
        return
    from pipeline.hub import is_hub_id, resolve_hub_id

    if is_hub_id(str(model.path)):
        model.path = resolve_hub_id(str(model.path), "model.path")
    from pipeline.models.load import check_checkpoint_dir

    check_checkpoint_dir(os.path.expanduser(str(model.path)))


def _engine_errors(cfg: Config) -> list[str]:
    """Only the selected engine's keys and dependencies (an hf run never reads rollout.engine.vllm)."""
    from pipeline.engines.config import ENGINE_TYPES

    engine = cfg.rollout.engine
    if engine.type not in ENGINE_TYPES:
        return [f"rollout.engine.type={engine.type!r}: expected one of {ENGINE_TYPES} (rollout=hf|vllm)"]
    missing = [f"rollout.engine.{engine.type}.{k}" for k in engine[engine.type].keys()
               if OmegaConf.is_missing(engine[engine.type], k)]
    if missing:
        return [f"{', '.join(missing)}: not set (rollout=hf or rollout=vllm loads the engine's values)"]
    if engine.type == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            return ["rollout.engine.type=vllm (rollout=vllm) but vLLM is not installed: "
                    "pip install 'kernel-rl-pipeline[vllm]' on a GPU machine, or rollout=hf"]
    return []


def _logger_errors(cfg: Config) -> list[str]:
    """An online W&B run without credentials fails here, not after Ray and the models started."""
    if "wandb" not in cfg.logger.backends:
        return []
    from pipeline.wandb_setup import has_credentials, resolve_mode

    try:
        mode, why = resolve_mode(cfg.logger.mode)
    except ValueError as e:
        return [str(e)]
    if mode == "online" and not has_credentials():
        return [f"W&B online ({why}) but no W&B API key: set WANDB_API_KEY or run `wandb login`, "
                "or log offline (logger.mode=offline; `wandb sync` uploads later)"]
    return []


def _check_local_gpus(resources: ResourcesConfig) -> None:
    """A local Ray cluster gets this machine's GPUs: a split that cannot fit fails before Ray starts
    (a remote cluster is checked by create_resource_pools once its resources are known)."""
    if resources.ray.address is not None:
        return
    gpus = resources.ray.num_gpus
    if gpus is None:
        if resources.sampler.gpus + resources.trainer.gpus == 0:
            return
        import torch

        gpus = torch.cuda.device_count()
    from pipeline.resources import plan_resources

    plan_resources(resources, {"GPU": float(gpus), "CPU": float("inf")})
