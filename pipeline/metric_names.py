"""Logged metric names: verl's wherever verl logs the same quantity, so runs of both frameworks
share one W&B dashboard; kernel-specific quantities keep their own prefixes (``kernel/``,
``hack/``, ``error/``, ``sandbox/``, ``pipeline/``, ``rollout/``, ``batch/``).

The loop, trainer and algorithms compute metrics under their internal names (the loop's
history, bench/pipeline.py and the unit tests read those); :func:`to_logged` renames them once,
where the logger writes them out (console, metrics.jsonl, W&B). docs/metrics.md has the table.
"""
from __future__ import annotations

import re
from typing import Any

# internal name -> logged name (verl's where it has the quantity)
RENAMES: dict[str, str] = {
    "timing/gen": "timing_s/gen",
    "timing/reward_tail": "timing_s/reward",       # the part of rewarding the step waits for
    "timing/gen_total": "timing_s/gen_total",
    "timing/train": "timing_s/train",              # verl splits it: old_log_prob + adv + update_actor
    "timing/weight_sync": "timing_s/update_weights",
    "timing/step": "timing_s/step",
    "timing/prologue_gen": "timing_s/prologue_gen",
    "timing/eval_p50": "timing_s/eval_p50",        # one evaluation (last token -> score) of the batch
    "timing/eval_p95": "timing_s/eval_p95",
    "timing/eval_max": "timing_s/eval_max",
    "mismatch/kl": "rollout_corr/kl",              # verl's KL(pi_rollout || pi_training), direct
    "mismatch/k3_kl": "rollout_corr/k3_kl",        # verl's k3 estimator of the same
    "response/length_mean": "response_length/mean",
    "response/length_max": "response_length/max",
    "response/truncated_frac": "response_length/clip_ratio",
    "response/not_okay_ratio": "response_length/not_okay_ratio",
    "reward/mean": "critic/score/mean",            # the per-turn score s_t, as verl's sequence score
    "reward/max": "critic/score/max",
    "reward/min": "critic/score/min",
    "reward/std": "critic/score/std",
    "reward/positive_frac": "critic/score/positive_frac",
    "score/mean": "critic/score/mean",             # the same value as reward/mean
    "score/max": "critic/score/max",
    "reward/return_mean": "critic/returns/mean",
    "reward/return_max": "critic/returns/max",
    "actor/pg_clipfrac_dual": "actor/pg_clipfrac_lower",  # verl's name for the dual-clip share
    "score/parse_ok": "kernel/parse_ok",
    "score/compiled": "kernel/compiled",
    "score/correct": "kernel/correct",
    "score/speedup_mean": "kernel/speedup_mean",
    "score/fast_1": "kernel/fast_1",
}
_TURN = re.compile(r"^reward/turn(\d+)_mean$")

# bf16 dense peak per GPU (TFLOP/s) by device-name fragment, for perf/mfu/actor
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0,
               "L40S": 362.0, "B200": 2250.0}


def logged_name(key: str) -> str:
    m = _TURN.match(key)
    if m:
        return f"critic/score/turn{m.group(1)}_mean"
    return RENAMES.get(key, key)


def peak_flops(device_name: str | None) -> float | None:
    for fragment, tflops in PEAK_TFLOPS.items():
        if device_name and fragment in device_name:
            return tflops * 1e12
    return None  # CPU or an unknown GPU: no MFU rather than a wrong one


def to_logged(metrics: dict[str, Any], perf: dict[str, Any] | None = None) -> dict[str, float]:
    """Scalars under their logged names, plus verl's perf/* derived from them.

    ``perf``: ``gpus`` (all GPUs of the job), ``trainer_gpus``, ``params`` (model parameters),
    ``peak_flops`` (per GPU, None on CPU)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, (int, float)):  # bool included: a flag logs as 0/1
            out[logged_name(k)] = float(v)
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


def console_key(key: str) -> str:
    """``logger.console_keys`` may name a metric by its old internal name."""
    return logged_name(key)
