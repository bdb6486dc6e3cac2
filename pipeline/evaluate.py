"""Held-out evaluation: ``python -m pipeline.evaluate +experiment=kernel_multiturn
evaluate.checkpoint=<run dir>/checkpoints/step_N [evaluate.k=16]``.

Runs k multi-turn trajectories per held-out task with the sampler side (same engine, env and
prompts as training), then reports, per turn budget t = 1..T (an attempt = a trajectory's best
correct kernel within its first t turns): pass@k (Chen et al.'s unbiased estimator) for each k
in ``evaluate.ks``, best@k / avg@k of correctness and speedup, and fast_p. Writes
``eval.json`` and logs through the configured logger, in the evaluation's own output dir
(conf/eval.yaml: ``<run>/eval/step_N/<split>_<date>_<time>/`` for a run's checkpoint), never in
the training run's files; its W&B run has job type ``eval`` and an id of its own.

``evaluate.search=beam`` runs Kevin's test-time beam search instead (``pipeline.beam``:
``evaluate.beam.width`` trajectories per task, the best ``keep`` continued every
``turns_per_round`` turns, for ``rounds`` rounds) and reports ``eval/beam/<metric>/budget_<b>``
per budget b = turns so far.
"""
from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from pipeline.beam import beam_metrics, beam_search, check_beam
from pipeline.evaluate_config import SEARCHES, BeamConfig, EvaluateConfig
from pipeline.eval_metrics import summarize
from pipeline.sample import Sample
from pipeline.conf_files import CONF_PATH
from pipeline.config import register
from rewards.interface import env_spec, split_tasks

if TYPE_CHECKING:
    from pipeline.config import Config

register()


def attempts_by_budget(samples: list[Sample], turns: int) -> dict[int, list[tuple[str, bool, float | None]]]:
    """Per turn budget t: one attempt per trajectory = its fastest correct turn among the first t."""
    by_traj: dict[tuple[str, int], list[Sample]] = {}
    for s in samples:
        by_traj.setdefault((s.task_id, s.traj), []).append(s)
    out: dict[int, list[tuple[str, bool, float | None]]] = {}
    for t in range(1, turns + 1):
        rows = []
        for (task, _), ss in sorted(by_traj.items()):
            good = [s.outcome for s in ss if s.turn < t and s.outcome is not None and s.outcome.correct]
            speed = max((float(o.speedup or 0.0) for o in good), default=None)
            rows.append((task, bool(good), speed))
        out[t] = rows
    return out


def evaluation_metrics(samples: list[Sample], turns: int, ks: list[int],
                       fast_ps: list[float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for t, rows in attempts_by_budget(samples, turns).items():
        for key, val in summarize(rows, ks, fast_ps).items():
            out[f"{key}/turns_{t}" if t < turns else key] = val
    out["eval/samples"] = float(len(samples))
    out.update(score_summary(samples))
    return out


def score_summary(samples: list[Sample]) -> dict[str, float]:
    """The mean score a training run logs (critic/score/mean), over every held-out turn, and the
    mean over tasks of each task's best score."""
    if not samples:
        return {}
    best: dict[str, float] = {}
    for s in samples:
        best[s.task_id] = max(best.get(s.task_id, float("-inf")), float(s.score))
    return {"eval/score/mean": sum(float(s.score) for s in samples) / len(samples),
            "eval/score/best_mean": sum(best.values()) / len(best)}


def _replace(node: Any, **values: Any) -> Any:
    node = copy.deepcopy(node)
    for k, v in values.items():
        setattr(node, k, v)
    return node


async def _collect(samplers: Any, tasks: list[Any], expected: int,
                   beam: BeamConfig | None = None) -> list[Sample]:
    from tqdm import tqdm

    with tqdm(total=expected, desc="evaluate", file=sys.stderr, dynamic_ncols=True) as bar:
        async def generate(starts: Any = None) -> Any:
            async for s in samplers.generate(0, tasks, 0, starts):
                bar.update(1)
                yield s

        if beam is not None:
            return await beam_search(generate, [t.task_id for t in tasks], beam)
        return [s async for s in generate()]


def check(ev: EvaluateConfig) -> None:
    """Evaluate's own checks; each message names the key."""
    if ev.search not in SEARCHES:
        raise ValueError(f"evaluate.search={ev.search!r}: expected one of {SEARCHES}")
    if ev.search == "beam":
        errors = check_beam(ev.beam, ev.ks)
        if errors:
            raise ValueError("; ".join(errors))
        return
    bad = [k for k in ev.ks if k < 1 or k > ev.k]
    if bad:
        raise ValueError(f"evaluate.ks={list(ev.ks)}: every k must be in [1, evaluate.k={ev.k}]")


def _check_split(conf: Config, ev: EvaluateConfig) -> None:
    from pipeline.config import ConfigError

    if not split_tasks(conf.env, conf.reward, conf.toy, ev.split):
        chosen = f" reward.task_ids={list(conf.reward.task_ids)}" if conf.env == "kernel" and conf.reward.task_ids else ""
        raise ConfigError(f"invalid configuration:\n  evaluate.split={ev.split!r} has no tasks "
                          f"(env={conf.env}{chosen}): choose another split (evaluate.split=train) "
                          "or tasks (reward.task_ids=[...])")


def preflight(cfg: DictConfig) -> Config:
    """Every check that needs no Ray or model, the training run's (pipeline.config.preflight)
    and the evaluation's own: a bad key stops here in one block. Returns the resolved config."""
    from pipeline.config import ConfigError, preflight as run_preflight

    conf = run_preflight(cfg)
    ev = conf.evaluate
    try:
        check(ev)
        if ev.checkpoint:
            model_dir_of(ev.checkpoint, "evaluate.checkpoint")
        if ev.compare:
            model_dir_of(ev.compare, "evaluate.compare")
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"invalid configuration:\n  {e}") from None
    _check_split(conf, ev)
    return conf


def run(cfg: DictConfig, run_dir: str | Path) -> dict[str, float]:
    """Evaluate, write ``eval.json`` and log; returns the metrics."""
    return run_samples(cfg, run_dir)[1]


def run_samples(cfg: DictConfig, run_dir: str | Path) -> tuple[list[Sample], dict[str, float]]:
    """:func:`run`, also returning every generated Sample."""
    from pipeline.evaluator_memory import leave_room_for_pools
    from pipeline.resources import init_ray, plan_resources
    from pipeline.sampler import SamplerGroup

    import ray

    conf = preflight(cfg)  # typed at composition; unused groups may hold MISSING values
    ev = conf.evaluate
    beam = ev.beam if ev.search == "beam" else None
    model_cfg = conf.model
    if ev.checkpoint:
        model_cfg = _replace(model_cfg, path=str(model_dir_of(ev.checkpoint, "evaluate.checkpoint")))
    elif model_cfg.warm_start and model_cfg.path == "tiny":
        # the model the training run starts from (the laptop's warm start, cached)
        from pipeline import warm_start
        from pipeline.config import resolved_profile

        model_cfg = _replace(model_cfg, path=str(warm_start.ensure(conf, resolved_profile(conf), [])))
    rollout = _replace(conf.rollout, n_trajectories=ev.k if beam is None else beam.width,
                       turns=conf.rollout.turns if beam is None else beam.turns_per_round,
                       temperature=ev.temperature if ev.temperature is not None
                       else conf.rollout.temperature)
    started = init_ray(conf.resources)
    try:
        plan = plan_resources(conf.resources, ray.cluster_resources())
        # no trainer here; the engine takes rollout.engine.vllm.gpu_memory_utilization of its GPU
        leave_room_for_pools(conf, colocated=False)
        env = env_spec(conf.env, conf.reward, conf.sandbox, conf.toy)
        samplers = SamplerGroup(model_cfg, rollout, env, n_workers=plan.n_samplers,
                                num_cpus=plan.sampler_bundles[0]["CPU"],
                                num_gpus=plan.sampler_gpus_per_worker)
        try:
            tasks = ray.get(samplers.workers[0].tasks.remote(ev.split))
            if ev.max_tasks > 0:
                tasks = tasks[:ev.max_tasks]
            if not tasks:
                raise ValueError(f"evaluate.split={ev.split!r} has no tasks")
            rounds = beam.rounds if beam is not None else 1
            samples = asyncio.run(_collect(samplers, tasks, len(tasks) * rollout.n_trajectories
                                           * rollout.turns * rounds, beam))
        finally:
            samplers.shutdown()
    finally:
        if started:
            ray.shutdown()
    if beam is not None:
        metrics = {**beam_metrics(samples, beam, list(ev.ks), list(ev.fast_ps)),
                   **score_summary(samples)}
    else:
        metrics = evaluation_metrics(samples, rollout.turns, list(ev.ks), list(ev.fast_ps))
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "eval.json").write_text(json.dumps(metrics, indent=1))
    from pipeline.metrics import MetricsLogger

    step = Path(str(ev.checkpoint)).name if ev.checkpoint else "model"
    # its own W&B run (job type eval, a new id) in its own dir, grouped with the training run's name
    logger = MetricsLogger(conf.logger, run_dir, run_name=f"{conf.name}-eval-{step}",
                           resolved_config=OmegaConf.to_container(cfg), job_type="eval",
                           group=str(conf.name))
    try:
        logger.log(0, metrics)
        logger.log_table(0, samples)
    finally:
        logger.close()
    for k, v in sorted(metrics.items()):
        print(f"{k:32s} {v:.4f}", file=sys.stderr)
    return samples, metrics


def model_dir_of(path: str, key: str) -> Path:
    """A run checkpoint (its model/ inside) or an HF model directory itself (a warm start's)."""
    p = Path(path).expanduser()
    if (p / "model" / "config.json").is_file():
        return p / "model"
    if (p / "config.json").is_file():
        return p
    raise FileNotFoundError(f"{key}={path}: expected a checkpoint directory with model/ (HF format) "
                            "inside, or an HF model directory (config.json, weights, tokenizer)")


# the side-by-side table: (label, metric key) in the order printed
COMPARED = (("correct rate", "eval/avg_correct"), ("mean score", "eval/score/mean"),
            ("fast_1", "eval/fast_1"), ("best@k correct", "eval/best_correct"),
            ("best@k speedup", "eval/best_speedup"))


def side_by_side(names: list[str], metrics: list[dict[str, float]], k: int) -> str:
    width = max(16, *(len(n) for n in names))
    lines = [f"{'(k=' + str(k) + ')':16s}" + "".join(f"  {n:>{width}s}" for n in names)]
    for label, key in COMPARED:
        lines.append(f"{label:16s}" + "".join(f"  {m.get(key, float('nan')):>{width}.3f}" for m in metrics))
    return "\n".join(lines)


def compare(cfg: DictConfig, run_dir: Path) -> list[dict[str, float]]:
    """``evaluate.checkpoint`` and ``evaluate.compare``, each into its own subdirectory."""
    names = [str(cfg.evaluate.checkpoint), str(cfg.evaluate.compare)]
    model_dir_of(names[1], "evaluate.compare")  # fail before the first evaluation, not after it
    results = []
    for i, path in enumerate(names):
        one = copy.deepcopy(cfg)
        one.evaluate.checkpoint, one.evaluate.compare = path, None
        results.append(run(one, run_dir / f"model_{i}"))
    table = side_by_side(names, results, int(cfg.evaluate.k))
    (run_dir / "compare.json").write_text(json.dumps(dict(zip(names, results)), indent=1))
    print(table, file=sys.stderr, flush=True)
    return results


@hydra.main(config_path=CONF_PATH, config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from pipeline.config import ConfigError

    try:
        return _main(cfg)
    except ConfigError as e:  # the message names every key: a traceback would only bury it
        print(f"[pipeline] {e}", file=sys.stderr, flush=True)
        sys.exit(2)


def _main(cfg: DictConfig) -> float:
    print(f"[pipeline] evaluation output: {HydraConfig.get().runtime.output_dir}", file=sys.stderr, flush=True)
    if cfg.evaluate.compare:
        return float(compare(cfg, Path(HydraConfig.get().runtime.output_dir))[0].get("eval/best_correct", 0.0))
    metrics = run(cfg, HydraConfig.get().runtime.output_dir)
    ev = cfg.evaluate
    if ev.search == "beam":
        budget = ev.beam.rounds * ev.beam.turns_per_round
        return float(metrics.get(f"eval/beam/best_correct/budget_{budget}", 0.0))
    return float(metrics.get("eval/best_correct", 0.0))


if __name__ == "__main__":
    main()
