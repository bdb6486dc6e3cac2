"""Per-step metrics from samples (score/*, hack/*, prompt_length/*, and what the env names in its
outcomes, e.g. the kernel env's sandbox/*), and where they go:
the console, ``metrics.jsonl`` in the run dir (every scalar, one line per step) and W&B
(``logger.mode``, pipeline/wandb_setup.py; ``logger=console`` turns it off). Every part computes its
metrics under the names they are logged by: verl's wherever verl logs the same quantity, so runs of
both frameworks share one W&B dashboard; kernel-specific quantities keep their own prefixes
(``kernel/``, ``hack/``, ``error/``, ``sandbox/``, ``pipeline/``, ``rollout/``, ``batch/``).
docs/metrics.md has the table."""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.logger_config import LoggerConfig
from pipeline.sample import Sample

if TYPE_CHECKING:
    from pipeline.parts import GeneratedBatch

BACKENDS = ("console", "jsonl", "wandb")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def score_metrics(samples: list[Sample]) -> dict[str, float]:
    """kernel/* from each sample's TurnOutcome fields, hack/<rule> shares, error share (the score's
    own statistics, critic/score/*, are the algorithm's rollout_metrics)."""
    n = len(samples)
    if n == 0:
        return {}
    o = [s.outcome for s in samples if s.outcome is not None]  # a Sample without one counts as all-false
    out = {"kernel/parse_ok": sum(d.parse_ok for d in o) / n, "kernel/compiled": sum(d.compiled for d in o) / n,
           "kernel/correct": sum(d.correct for d in o) / n}
    speedups = [float(d.speedup) for d in o if d.correct and d.speedup is not None
                and math.isfinite(float(d.speedup))]
    out["kernel/speedup_mean"] = _mean(speedups)
    out["kernel/fast_1"] = sum(1 for x in speedups if x > 1.0) / n
    # verl's length statistics (tokens; the prompt includes the episode's history)
    prompts = [float(len(s.prompt_ids)) for s in samples]
    responses = [float(len(s.response_ids)) for s in samples]
    out.update({"prompt_length/mean": _mean(prompts), "prompt_length/max": max(prompts),
                "prompt_length/min": min(prompts), "response_length/min": min(responses)})
    out["sample/error_frac"] = sum(1 for s in samples if s.error) / n
    hacks: dict[str, int] = {}
    for d in o:
        for h in d.hacks:
            hacks[h] = hacks.get(h, 0) + 1
    out.update({f"hack/{h}": c / n for h, c in sorted(hacks.items())})
    kinds: dict[str, int] = {}
    for d in o:
        if d.error_kind:
            kinds[d.error_kind] = kinds.get(d.error_kind, 0) + 1
    out.update({f"error/{k}": c / n for k, c in sorted(kinds.items())})
    return out


def env_metrics(samples: list[Sample], wall_s: float) -> dict[str, float]:
    """The metrics the environment named in its outcomes (``TurnOutcome.metrics``), each reduced
    over the turns that carry it as the interface says: ``_per_min`` names the sum per minute of
    ``wall_s``, ``_p50`` names the median, any other name the mean (none for the toy env)."""
    values: dict[str, list[float]] = {}
    for s in samples:
        for name, value in (s.outcome.metrics if s.outcome is not None else {}).items():
            values.setdefault(name, []).append(float(value))
    out = {}
    for name, xs in sorted(values.items()):
        if name.endswith("_per_min"):
            out[name] = sum(xs) / (wall_s / 60.0) if wall_s > 0 else 0.0
        elif name.endswith("_p50"):
            out[name] = statistics.median(xs)
        else:
            out[name] = _mean(xs)
    return out


def score_latency_metrics(samples: list[Sample]) -> dict[str, float]:
    """Seconds of one evaluation (a sample's last token -> its score, ``env.score`` with any wait
    for a sandbox slot): p50, p95 (nearest rank) and max over the batch. ``timing_s/reward`` is
    compared with the p95: a tail above it means the step waited for more than one slow score.
    Where the environment says its evaluator ran some answers (``TurnOutcome.evaluated``), only
    those count: an answer that fails to parse is scored in microseconds and is no evaluation."""
    timed = [s for s in samples if s.t_gen_end and s.t_eval_end]
    evaluated = [s for s in timed if s.outcome is not None and s.outcome.evaluated]
    xs = sorted(s.t_eval_end - s.t_gen_end for s in (evaluated or timed))
    if not xs:
        return {}
    p95 = xs[max(0, math.ceil(0.95 * len(xs)) - 1)]
    return {"timing_s/score_p50": statistics.median(xs), "timing_s/score_p95": p95, "timing_s/score_max": xs[-1]}


def step_metrics(trained: GeneratedBatch, gen: GeneratedBatch | None, t_train: float, t_push: float, t_total: float,
                 rollout_metrics: Any) -> dict[str, float]:
    """A step's line: the trained batch's rollout, score and env figures, the batch generated
    during the step (``gen``; sync: the same one, one_off: the next) and the step's timings."""
    m: dict[str, float] = dict(trained.rollout)
    m.update(rollout_metrics(trained.samples))
    m.update(score_metrics(trained.samples))
    m.update(env_metrics(trained.samples, trained.wall))
    t_gen = gen.wall if gen is not None else 0.0
    m["timing_s/gen"] = (gen.last_token - gen.t_start) if gen is not None else 0.0
    m["timing_s/reward"] = gen.reward_tail if gen is not None else 0.0
    m.update(score_latency_metrics(gen.samples) if gen is not None else {})  # the same batch's
    m["timing_s/gen_total"] = t_gen
    m["timing_s/train"] = t_train
    m["timing_s/update_weights"] = t_push
    m["timing_s/step"] = t_total
    ideal = max(t_gen, t_train) + t_push
    m["pipeline/efficiency"] = ideal / t_total if t_total > 0 else 0.0
    m["pipeline/trainer_idle"] = max(0.0, 1.0 - t_train / t_total) if t_total > 0 else 0.0
    m["pipeline/sampler_idle"] = max(0.0, 1.0 - t_gen / t_total) if t_total > 0 else 0.0
    tokens = sum(len(s.response_ids) for s in trained.samples)
    m["perf/tokens_per_s"] = tokens / trained.wall if trained.wall > 0 else 0.0
    m["perf/samples"] = float(len(trained.samples))
    return m


def episode_rows(samples: list[Sample], k: int, decode: Any = None,
                 tail_chars: int = 400) -> list[list[Any]]:
    """A few episodes for the table: the best-scored samples, then the worst ones. Their text is
    scrubbed of secrets (the environment scrubs what it returns; this also covers the response and
    pipeline errors) before it is cut, as it goes to episodes.jsonl and W&B."""
    from rewards.interface import scrub
    ranked = sorted(samples, key=lambda s: (-s.score, s.uid))
    picked = ranked[:(k + 1) // 2] + [s for s in ranked[::-1][:k // 2] if s not in ranked[:(k + 1) // 2]]
    rows = []
    for s in picked:
        o = s.outcome
        kind = o.error_kind if o is not None else None
        verdict = "correct" if o is not None and o.correct else (kind or s.error or "")
        prompt = scrub(decode(s.prompt_ids))[-tail_chars:] if decode is not None else ""
        rows.append([s.step, s.task_id, s.traj, s.turn, prompt, scrub(s.response_text)[-tail_chars:],
                     scrub(str(verdict)), float(s.score)])
    return rows


EPISODE_COLUMNS = ["step", "task", "traj", "turn", "prompt_tail", "response_tail", "verdict", "score"]


def sample_record(s: Sample) -> dict[str, Any]:
    """One line of samples.jsonl: what a reward number came from, without the text (a step's 64
    answers take ~30 KB): which task, turn and weights; the score and return; the evaluator's
    verdict (times in ms, flags, the wall seconds the evaluation took)."""
    o = s.outcome
    v = (o.verdict if o is not None else None) or {}
    wall = v.get("wall_s") or {}
    return {"step": s.step, "uid": s.uid, "task": s.task_id, "traj": s.traj, "turn": s.turn,
            "version": s.policy_version, "score": s.score, "return": s.ret,
            "finish": s.finish_reason, "response_tokens": len(s.response_ids),
            "parse_ok": bool(o and o.parse_ok), "compiled": bool(o and o.compiled),
            "correct": bool(o and o.correct), "speedup": o.speedup if o is not None else None,
            "error_kind": o.error_kind if o is not None else "pipeline_error", "hacks": list(o.hacks) if o else [],
            "flags": list(v.get("flags") or []), "new_ms": v.get("new_runtime_ms"), "ref_ms": v.get("ref_runtime_ms"),
            "eval_s": wall.get("total"), "gen_s": round(s.t_gen_end - s.t_gen_start, 3) if s.t_gen_end else None,
            "error": (s.error or "")[:200] or None}


def _reopen(path: Path, step: int) -> Any:
    """``path`` opened for writing with only its lines of steps before ``step`` kept."""
    kept = _lines_before(path, step) if step > 0 else []
    f = open(path, "w")
    f.writelines(kept)
    f.flush()
    return f


def _lines_before(path: Path, step: int) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines(keepends=True)
            if line.strip() and json.loads(line).get("step", -1) < step]


# bf16 dense peak per GPU (TFLOP/s) by device-name fragment, for perf/mfu/actor
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0,
               "L40S": 362.0, "B200": 2250.0}


def peak_flops(device_name: str | None) -> float | None:
    for fragment, tflops in PEAK_TFLOPS.items():
        if device_name and fragment in device_name:
            return tflops * 1e12
    return None  # CPU or an unknown GPU: no MFU rather than a wrong one


def with_perf(metrics: dict[str, Any], perf: dict[str, Any] | None = None) -> dict[str, float]:
    """The scalars of ``metrics``, plus verl's perf/* derived from them.

    ``perf``: ``gpus`` (all GPUs of the job), ``trainer_gpus``, ``params`` (model parameters),
    ``peak_flops`` (per GPU, None on CPU)."""
    # bool included: a flag logs as 0/1
    out = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    perf = perf or {}
    step_s = out.get("timing_s/step", 0.0)
    if "batch/tokens" in out and step_s > 0:
        # verl: every token of the batch (prompt + response) per second per GPU of the job
        out["perf/total_num_tokens"] = out["batch/tokens"]
        out["perf/time_per_step"] = step_s
        out["perf/throughput"] = out["batch/tokens"] / (step_s * max(1, int(perf.get("gpus") or 0)))
    train_s = out.get("actor/rank_time_s") or out.get("timing_s/train", 0.0)
    peak, params = perf.get("peak_flops"), perf.get("params")
    if peak and params and train_s > 0 and "actor/tokens" in out:
        # 6 N flops per trained token (forward + backward), the usual dense estimate
        achieved = 6.0 * float(params) * out["actor/tokens"] / train_s
        out["perf/mfu/actor"] = achieved / (peak * max(1, int(perf.get("trainer_gpus") or 1)))
    return out


class MetricsLogger:
    """``perf``: what verl's perf/* need (:func:`with_perf`); ``group`` overrides
    ``logger.group`` (a sweep's jobs share one); ``job_type``: the W&B run's (``eval`` for
    pipeline.evaluate)."""

    def __init__(self, cfg: LoggerConfig, run_dir: str | Path, run_name: str,
                 resolved_config: dict[str, Any], resume: bool = False, start_step: int = 0,
                 group: str | None = None, perf: dict[str, Any] | None = None,
                 job_type: str = "train") -> None:
        unknown = [b for b in cfg.backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"logger.backends has {unknown}: expected a subset of {BACKENDS}")
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.samples = None
        if "jsonl" in cfg.backends:
            # steps logged after the checkpoint we resume from are run again: drop their lines
            self.jsonl = _reopen(self.run_dir / "metrics.jsonl", start_step if resume else 0)
            if cfg.samples:
                self.samples = _reopen(self.run_dir / "samples.jsonl", start_step if resume else 0)
        self.perf = dict(perf or {})
        self.wandb = None
        self.wandb_mode: str | None = None
        self.job_type = job_type
        self._wandb_step = -1  # the last step sent to W&B (its steps only go forward)
        if "wandb" in cfg.backends:
            self.wandb = self._init_wandb(cfg.name or run_name, resolved_config, resume,
                                          cfg.group or group)
        with open(self.run_dir / "config.json", "w") as f:
            json.dump(resolved_config, f, indent=1, default=str)

    def _init_wandb(self, run_name: str, resolved_config: dict[str, Any], resume: bool,
                    group: str | None) -> Any:
        import wandb

        from pipeline.wandb_setup import offline_line, resolve_mode

        cfg = self.cfg
        mode, why = resolve_mode(cfg.mode)
        run_id_file = self.run_dir / "wandb_run_id"
        run_id = run_id_file.read_text().strip() if resume and run_id_file.exists() else None
        wandb_dir = Path(os.path.expanduser(str(cfg.dir))) if cfg.dir else self.run_dir
        wandb_dir.mkdir(parents=True, exist_ok=True)
        kw = dict(project=cfg.project, entity=cfg.entity, group=group, tags=list(cfg.tags),
                  name=run_name, dir=str(wandb_dir), config=resolved_config, id=run_id,
                  resume="allow" if run_id else None, reinit="finish_previous",
                  job_type=self.job_type)
        try:
            run = wandb.init(mode=mode, **kw)
        except Exception as e:
            if cfg.mode != "auto" or mode != "online":
                raise
            # auto found credentials but W&B cannot be reached (no network, revoked key): the
            # run goes on offline rather than stopping a job that may have waited for its nodes
            mode, why = "offline", f"online failed: {type(e).__name__}"
            run = wandb.init(mode=mode, **kw)
        if mode == "offline":
            print(offline_line(wandb_dir, why), file=sys.stderr, flush=True)
        self.wandb_mode = mode
        if mode != "disabled" and getattr(run, "id", None):  # a disabled run's id is a dummy
            run_id_file.write_text(run.id)
        return run

    def log(self, step: int, metrics: dict[str, float]) -> None:
        scalars = with_perf(metrics, self.perf)
        if self.jsonl is not None:
            self.jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
            self.jsonl.flush()
        if self.wandb is not None and step > self._wandb_step:
            self.wandb.log(scalars, step=step)
            self._wandb_step = step
        if "console" in self.cfg.backends:
            # full names: the last part alone is ambiguous (timing_s/step printed as step=)
            line = "  ".join(f"{k}={scalars[k]:.4g}" for k in dict.fromkeys(self.cfg.console_keys)
                             if k in scalars)
            from tqdm import tqdm

            tqdm.write(f"[step {step}] {line}", file=sys.stderr)  # above any progress bar

    def rewind(self, step: int) -> None:
        """Steps from ``step`` on are trained again (a restarted trainer): metrics.jsonl keeps one
        line per step, the new one. W&B steps only go forward: it keeps the first values of a
        redone step and gets only the steps after the last one it has."""
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = _reopen(self.run_dir / "metrics.jsonl", step)
        if self.samples is not None:
            self.samples.close()
            self.samples = _reopen(self.run_dir / "samples.jsonl", step)

    def log_samples(self, samples: list[Sample]) -> None:
        """Every scored turn of a step, a line each (samples.jsonl; ``logger.samples``)."""
        if self.samples is not None:
            self.samples.writelines(json.dumps(sample_record(s), default=str) + "\n" for s in samples)
            self.samples.flush()

    def log_table(self, step: int, samples: list[Sample], decode: Any = None) -> None:
        if self.cfg.table_every <= 0 or step % self.cfg.table_every:
            return
        rows = episode_rows(samples, self.cfg.table_rows, decode)
        with open(self.run_dir / "episodes.jsonl", "a") as f:
            for r in rows:
                f.write(json.dumps(dict(zip(EPISODE_COLUMNS, r))) + "\n")
        if self.wandb is not None and step >= self._wandb_step:  # not a redone step's again
            import wandb

            self.wandb.log({"episodes": wandb.Table(columns=EPISODE_COLUMNS, data=rows)}, step=step)

    def log_image(self, step: int, key: str, path: Path) -> None:
        if self.wandb is not None and step >= self._wandb_step:  # not a redone step's again
            import wandb

            self.wandb.log({key: wandb.Image(str(path))}, step=step)

    def close(self) -> None:
        for f in (self.jsonl, self.samples):
            if f is not None:
                f.close()
        self.jsonl = self.samples = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
