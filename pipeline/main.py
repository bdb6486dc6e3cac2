"""Entry point: ``python -m pipeline.main +experiment=kernel_multiturn [key=value ...]``.

Composes the typed config (pipeline/config.py + conf/), starts or joins Ray, splits it into
resource pools (pipeline/resources.py), builds the sampler group (engine + reward env per worker),
the FSDP2 trainer, the weight push and the logger, then runs the step loop. ``-m`` sweeps run one
job after the other, each with its own run dir, W&B run and Ray session.
"""
from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from pipeline import checkpoint
from pipeline.conf_files import CONF_PATH
from pipeline.config import Config, ConfigError, preflight, register, resolved_profile
from rewards.interface import env_spec

if TYPE_CHECKING:
    from pipeline.loop_config import PipelineConfig
    from pipeline.resources import ResourcePools

register()


def evaluator_gpus(pools: ResourcePools) -> list[list[int]] | None:
    """Each sampler worker's share of the dedicated evaluation pool (None without one)."""
    if pools.evaluator is None:
        return None
    from pipeline.resources import assign_evaluator_gpus, bundle_nodes, evaluator_gpu_ids

    shares = assign_evaluator_gpus(bundle_nodes(pools.sampler), evaluator_gpu_ids(pools.evaluator))
    print(f"[pipeline] evaluation pool: sampler worker i times kernels on GPUs {shares}[i]",
          file=sys.stderr, flush=True)
    return shares


def banner(cfg: Config, profile: str) -> str:
    r, p = cfg.rollout, cfg.pipeline
    size = (f"{p.tasks_per_batch} tasks x {r.n_trajectories} trajectories x {r.turns} turns per "
            f"batch, {p.steps} steps, max response {r.max_response_length} tokens")
    if profile == "laptop":
        model = (f"tiny Qwen2 warm-started by {cfg.model.warm_start} (pipeline.sft, cached)"
                 if cfg.model.warm_start and cfg.env == "kernel" and cfg.model.path == "tiny"
                 else "tiny random Qwen2" if cfg.model.path == "tiny" else f"model.path={cfg.model.path}")
        backend = cfg.reward.backend if cfg.env == "kernel" else "toy"
        why = "profile=laptop" if cfg.profile == "laptop" else "no GPU visible"
        return (f"[pipeline] laptop profile ({why}): {model}, {cfg.env} "
                f"env on the {backend} backend, {size}, {_schedule(p)}. On a cluster: model=local model.path=<HF dir> "
                "resources=<split> (or profile=full).")
    return f"[pipeline] full profile: model.path={cfg.model.path}, {size}, {_schedule(p)}."


def _schedule(p: PipelineConfig) -> str:
    from pipeline.staleness import resolve_staleness, schedule_name

    k = resolve_staleness(p.mode, p.max_staleness)
    return f"max_staleness={k} ({schedule_name(k)})"


class Session:
    """Everything one job builds; ``close`` tears it down in reverse order."""

    def __init__(self, cfg: Config, run_dir: Path, resolved: dict[str, Any],
                 run_name: str | None = None, group: str | None = None,
                 env_factory: Any = None) -> None:
        """``env_factory(cfg, eval_gpus)``: the samplers' env spec in place of
        ``rewards.interface.env_spec`` (bench/pipeline.py gives the kernel env stored answers to
        evaluate)."""
        self.closers: list[Any] = []
        self.run_name, self.group = run_name or str(cfg.name), group
        self.env_factory = env_factory or (
            lambda c, eval_gpus: env_spec(c.env, c.reward, c.sandbox, c.toy, eval_gpus))
        try:
            self._build(cfg, run_dir, resolved)
        except BaseException:
            self.close()  # whatever was started is stopped again: a sweep's next job starts clean
            raise

    def _build(self, cfg: Config, run_dir: Path, resolved: dict[str, Any]) -> None:
        import matplotlib  # both import in seconds on first use: pay it before the loop, not in step 0

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
        import verl.trainer.ppo.core_algos  # noqa: F401

        from pipeline.algorithms import build_train_batch, rollout_metrics
        from pipeline.loop import Loop
        from pipeline.metrics import MetricsLogger
        from pipeline.models.load import load_tokenizer
        from pipeline.parts import LoopParts
        from pipeline.evaluator_memory import leave_room_for_pools
        from pipeline.resources import create_resource_pools, init_ray, route_builds
        from pipeline.rollout_config import max_response_length, response_length_at
        from pipeline.sampler import SamplerGroup
        from pipeline.trainer import TrainerGroup
        from pipeline.weight_push import choose_transport, make_weight_push

        env_vars = actor_env_vars(cfg.pipeline.progress)
        import ray

        if init_ray(cfg.resources, runtime_env={"env_vars": env_vars}):
            self.closers.append(ray.shutdown)
        pools = create_resource_pools(cfg.resources)
        self.closers.append(pools.remove)
        shared = pools.plan.colocated

        ckpt_root = run_dir / cfg.checkpoint.dir
        resume_dir = checkpoint.resolve_resume(cfg.resume, ckpt_root)
        if cfg.resume == "never" and checkpoint.latest(ckpt_root) is not None:
            print(f"[pipeline] resume=never: {ckpt_root} holds checkpoints of an earlier run; this "
                  "run overwrites them step by step", file=sys.stderr, flush=True)
        state: dict[str, Any] = {}
        if resume_dir is not None:
            state = checkpoint.load_loop_state(resume_dir)
            checkpoint.set_rng_state(state["rng"])
            print(f"[pipeline] resuming from {resume_dir} at step {state['step'] + 1}", file=sys.stderr)
        self.start_step = state.get("step", -1) + 1

        leave_room_for_pools(cfg, shared)
        route_builds(cfg, pools.plan.n_samplers)
        samplers = SamplerGroup(cfg.model, cfg.rollout, self.env_factory(cfg, evaluator_gpus(pools)),
                                resource_pool=pools.sampler,
                                gpu_memory_fraction=cfg.resources.sampler.gpu_memory_fraction
                                if shared else None, env_vars=env_vars)
        self.closers.append(samplers.shutdown)
        a = cfg.algorithm
        pad_len = max_response_length(cfg.rollout)
        trainer = TrainerGroup(
            pools.trainer, cfg.model, cfg.trainer, a, pad_len, cfg.rollout.temperature,
            total_optim_steps=cfg.pipeline.steps * a.ppo_mini_batches,
            gpu_memory_fraction=cfg.resources.trainer.gpu_memory_fraction if shared else None,
            resume_dir=str(resume_dir) if resume_dir else None, env_vars=env_vars)
        self.closers.append(trainer.shutdown)
        on_gpu = cfg.resources.trainer.gpus > 0
        sync = make_weight_push(trainer, samplers, choose_transport(
            cfg.pipeline.weight_push, shared, on_gpu, shared_gpus=cfg.resources.trainer.gpus),
            timeout_s=cfg.pipeline.weight_push_timeout_s, verify=cfg.pipeline.verify_weight_push)
        tokenizer = load_tokenizer(cfg.model)
        tasks = ray.get(samplers.workers[0].tasks.remote(cfg.pipeline.task_split))
        self.logger = MetricsLogger(cfg.logger, run_dir, run_name=self.run_name,
                                    resolved_config=resolved, resume=resume_dir is not None,
                                    start_step=self.start_step, group=self.group,
                                    perf=perf_context(cfg, trainer.info, shared))
        self.closers.append(self.logger.close)
        rollout = cfg.rollout
        parts = LoopParts(
            samplers=samplers, trainer=trainer, weight_push=sync, tasks=tasks,
            build_batch=lambda samples, step: build_train_batch(
                samples, a, response_length_at(rollout, step), tokenizer.pad_token_id),
            rollout_metrics=lambda samples: rollout_metrics(samples, a),
            response_length=lambda step: response_length_at(rollout, step),
            expected_samples=cfg.pipeline.tasks_per_batch * rollout.n_trajectories * rollout.turns,
            logger=self.logger, run_dir=run_dir, checkpoint_cfg=cfg.checkpoint,
            decode=lambda ids: tokenizer.decode(ids[-200:]))
        self.loop = Loop(cfg.pipeline, parts, cfg.logger.timeline_every, start_step=self.start_step,
                         version=state.get("version", 0), pending=state.get("pending"),
                         resumed_from=resume_dir)

    def close(self) -> None:
        for fn in reversed(self.closers):
            try:
                fn()
            except Exception as e:  # teardown goes on: the next sweep job needs a clean Ray
                print(f"[pipeline] teardown: {type(e).__name__}: {e}", file=sys.stderr)


def perf_context(cfg: Config, trainer_info: dict[str, Any] | None, colocated: bool) -> dict[str, Any]:
    """What verl's perf/* metrics need: GPUs of the job, trainer GPUs, parameters, peak FLOP/s."""
    from pipeline.metrics import peak_flops

    r = cfg.resources
    info = trainer_info or {}
    pools = max(r.sampler.gpus, r.trainer.gpus) if colocated else r.sampler.gpus + r.trainer.gpus
    return {"gpus": pools + r.evaluator.gpus, "trainer_gpus": r.trainer.gpus,
            "params": info.get("params"), "peak_flops": peak_flops(info.get("device_name"))}


def actor_env_vars(progress: bool) -> dict[str, str]:
    """Environment of every Ray actor. Without progress bars, Hugging Face's own bars in the actors
    (the trainer's ``save_pretrained`` "Writing model shards") are off too: in a log file each is a
    line of carriage returns."""
    env = {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    if not progress:
        env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    return env


def quiet_progress(conf: Config) -> None:
    """Progress bars only on a terminal: nested tqdm bars written to a log file are a garble of
    carriage returns; the per-step console line says the same there."""
    if conf.pipeline.progress and not sys.stderr.isatty():
        conf.pipeline.progress = False
        print("[pipeline] stderr is not a terminal: progress bars off (the [step N] lines remain)",
              file=sys.stderr, flush=True)


def run(cfg: DictConfig, run_dir: str | Path, run_name: str | None = None,
        group: str | None = None, overrides: list[str] | None = None,
        dir_key: str = "hydra.run.dir") -> dict[str, float]:
    """One job: returns the last step's metrics (empty when the run was already complete).
    ``run_name``/``group``: the W&B run's (a sweep job's, pipeline/wandb_setup.sweep_names);
    ``overrides``: the command line's (a warm start passes its ``model.*`` ones on); ``dir_key``:
    the key that names another dir in hints (a sweep's is hydra.sweep.dir)."""
    run_dir = Path(run_dir)
    conf = preflight(cfg)  # every config and dependency error, before Ray starts
    profile = resolved_profile(conf)
    print(banner(conf, profile), file=sys.stderr, flush=True)
    resolved = OmegaConf.to_container(conf)
    if conf.sandbox.cache_dir:
        conf.sandbox.cache_dir = os.path.expanduser(str(conf.sandbox.cache_dir))
    if conf.model.warm_start and conf.model.path == "tiny":
        from pipeline import warm_start

        conf.model.path = str(warm_start.ensure(conf, profile, list(overrides or [])))
    if checkpoint.resolve_resume(conf.resume, run_dir / conf.checkpoint.dir) is not None:
        # before Ray or a model starts: a changed override must not continue the old run silently
        for line in checkpoint.check_resume_config(conf.resume, run_dir, resolved, dir_key=dir_key):
            print(f"[pipeline] resume=force, differs from the saved config: {line}", file=sys.stderr)
    quiet_progress(conf)
    session = Session(conf, run_dir, resolved, run_name=run_name, group=group)
    try:
        if session.start_step >= conf.pipeline.steps:
            print(f"[pipeline] {run_dir} already holds all {conf.pipeline.steps} steps", file=sys.stderr)
            return {}
        try:
            history = asyncio.run(session.loop.run())
        except (KeyboardInterrupt, asyncio.CancelledError):
            # a second Ctrl-C (or SIGTERM): the step under way is abandoned, no checkpoint of it
            raise Interrupted(interrupted_message(run_dir, conf)) from None
        except Exception as e:
            if _is_lost_actor(e):
                if session.loop.stop_requested:  # the signal reached the actors as well
                    raise Interrupted(interrupted_message(run_dir, conf)) from None
                print(lost_actor_message(e, run_dir, conf), file=sys.stderr, flush=True)
            raise
        if history:
            print(summary_line(history), file=sys.stderr, flush=True)
        return history[-1] if history else {}
    finally:
        session.close()


def summary_line(history: list[dict[str, float]]) -> str:
    """The run's last line: reward, correct rate and mean speedup, first step -> last step (and
    the mean of the first two steps -> the last two, the laptop default's bar)."""
    first, last = history[0], history[-1]

    def pair(key: str) -> str:
        return f"{first.get(key, 0.0):.3f} -> {last.get(key, 0.0):.3f}"

    head = [float(h.get("critic/score/mean", 0.0)) for h in history[:2]]
    tail = [float(h.get("critic/score/mean", 0.0)) for h in history[-2:]]
    skipped = [int(h["step"]) for h in history[1:] if h.get("actor/skipped")]
    return (f"[pipeline] summary, step {int(first['step'])} -> {int(last['step'])}: reward "
            f"{pair('critic/score/mean')} (mean of the first two steps {sum(head) / len(head):.3f} -> last two "
            f"{sum(tail) / len(tail):.3f}), correct {pair('kernel/correct')}, mean speedup "
            f"{pair('kernel/speedup_mean')}; steps after the first that trained on nothing: "
            f"{skipped if skipped else 'none'}")


class Interrupted(Exception):
    """Ctrl-C / SIGTERM stopped the run before the step under way finished; the message says
    where the last checkpoint is and how to continue."""


def interrupted_message(run_dir: Path, conf: Config) -> str:
    last = checkpoint.latest(run_dir / conf.checkpoint.dir)
    where = f"the last checkpoint is {last}" if last else "no checkpoint was written"
    return (f"[pipeline] interrupted: the step under way was abandoned; {where}. The same command "
            f"continues it (resume=auto, hydra.run.dir={run_dir}).")


def _is_lost_actor(e: BaseException) -> bool:
    from ray.exceptions import RayActorError  # ActorDiedError and ActorUnavailableError among them

    return isinstance(e, RayActorError)


def lost_actor_message(e: BaseException, run_dir: Path, conf: Config) -> str:
    """What to do when an actor the loop cannot replace (a trainer rank) is gone."""
    last = checkpoint.latest(run_dir / conf.checkpoint.dir)
    where = (f"the last checkpoint is {last}" if last else
             f"there is no checkpoint yet (checkpoint.every={conf.checkpoint.every})")
    return (f"[pipeline] a Ray actor the loop cannot replace was lost ({type(e).__name__}); the run "
            f"stops here and {where}. Continue with the same command plus resume=auto "
            f"hydra.run.dir={run_dir}.")


@hydra.main(config_path=CONF_PATH, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from pipeline.wandb_setup import is_multirun, sweep_names

    hc = HydraConfig.get()
    name, group = sweep_names(str(cfg.name), hc)
    try:
        last = run(cfg, hc.runtime.output_dir, run_name=name, group=group,
                   overrides=list(hc.overrides.task),
                   dir_key="hydra.sweep.dir" if is_multirun(hc) else "hydra.run.dir")
    except (ConfigError, checkpoint.ResumeMismatch) as e:
        # the message names every key: a traceback would only bury it
        print(f"[pipeline] {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except Interrupted as e:
        print(str(e), file=sys.stderr, flush=True)
        sys.exit(130)
    except KeyboardInterrupt:  # Ctrl-C before the step loop (Ray, the models starting)
        print(f"[pipeline] interrupted before the first step of this session ({hc.runtime.output_dir}): "
              "the same command starts it again (or continues its checkpoint, resume=auto)",
              file=sys.stderr, flush=True)
        sys.exit(130)
    return float(last.get("critic/score/mean", 0.0))


def cli() -> None:
    """``python -m pipeline.main`` and ``kernel-rl-train``: a renamed key on the command line is
    named with its new name before Hydra composes (its own message would not say)."""
    from pipeline.config import renamed_overrides

    renamed = renamed_overrides(sys.argv[1:])
    if renamed:
        print("[pipeline] invalid configuration:\n  " + "\n  ".join(renamed), file=sys.stderr, flush=True)
        sys.exit(2)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()


if __name__ == "__main__":
    cli()
