"""Run steps that hold a device (a GPU, or the host with ``cpu_run_slots``) prepare first and take it
only once ready: candidate code never runs in two of them at once, and the wait is not run time."""
from __future__ import annotations

import asyncio
import dataclasses

from sandbox.pool import SandboxPool
from tests.sandbox.conftest import fixture_source

ADD = fixture_source("tasks/add.py")

# Prints when its code started and when it last ran a forward: a step's stdout tail comes back in
# its verdict (nothing the candidate writes is shared with the host: /dev/shm is private per step).
_LOGGING_ANSWER = """
import time
import torch.nn as nn

_START = time.time()


class ModelNew(nn.Module):
    def forward(self, a, b):
        time.sleep(0.05)
        print(f"SPAN {_START} {time.time()}", flush=True)
        return a + b
"""


def _span(log_tail: str) -> tuple[float, float]:
    last = [ln for ln in log_tail.splitlines() if ln.startswith("SPAN ")][-1]
    return tuple(map(float, last.split()[1:]))  # type: ignore[return-value]


async def test_gated_run_steps_never_overlap_and_do_not_count_the_wait(sandbox_cfg):
    cfg = dataclasses.replace(sandbox_cfg, cpu_run_slots=1, max_concurrent=3)
    answers = [_LOGGING_ANSWER + f"\n# variant {i}\n" for i in range(3)]
    async with SandboxPool(cfg) as pool:
        results = await asyncio.gather(*[pool.evaluate(ADD, a, "cpu") for a in answers])
    spans = sorted(_span(r.log_tail) for r in results)
    assert all(r.correct and r.timed for r in results), results
    assert len(spans) == 3, spans
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, f"candidate code of two run steps overlapped: {spans}"
    # each step held the host for its own run, and the ones that waited say so
    assert all(r.wall_s["device_held"] > 0 for r in results), [r.wall_s for r in results]
    waits = sorted(r.wall_s["device_wait"] for r in results)
    assert waits[-1] >= min(r.wall_s["device_held"] for r in results) * 0.5, [r.wall_s for r in results]


async def test_ungated_cpu_run_steps_report_no_device_time(sandbox_cfg):
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(ADD, fixture_source("answers/add_cpp_correct.py"), "cpu")
    assert res.correct, res
    assert "device_held" not in res.wall_s and "device_wait" not in res.wall_s
    assert res.wall_s["correctness"] >= 0 and res.wall_s["timing"] >= 0


# Prints the span of every forward call: the first `correctness_trials` calls are the correctness
# trials, the rest the timing loop (warm-up and timed calls).
_CALLS_ANSWER = """
import time
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        t = time.time()
        time.sleep(0.03)
        print(f"CALL {t} {time.time()}", flush=True)
        return a + b
"""
_LOOPING_ANSWER = """
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        while True:
            pass
"""


def _calls(log_tail: str) -> list[tuple[float, float]]:
    return [tuple(map(float, ln.split()[1:3])) for ln in log_tail.splitlines() if ln.startswith("CALL ")]


async def test_shared_gate_times_alone_and_reruns_a_timeout_alone(sandbox_cfg):
    """Three run steps share the host's gate (cpu_run_slots=3) for load and correctness; every timing
    loop runs while no other step's answer runs; the answer that never returns timed out while
    others shared the gate, so it is run again alone before its timeout is its verdict."""
    cfg = dataclasses.replace(sandbox_cfg, cpu_run_slots=3, max_concurrent=3, run_timeout_s=6)
    answers = [_CALLS_ANSWER + f"\n# variant {i}\n" for i in range(2)] + [_LOOPING_ANSWER]
    async with SandboxPool(cfg) as pool:
        results = await asyncio.gather(*[pool.evaluate(ADD, a, "cpu") for a in answers])
        stats = pool.stats()
    *honest, looping = results
    assert all(r.correct and r.timed for r in honest), honest
    trials = cfg.correctness_trials
    calls = [_calls(r.log_tail) for r in honest]
    assert all(len(c) == trials + cfg.warmup_runs + cfg.timing_runs for c in calls), calls
    for i, mine in enumerate(calls):
        window = (mine[trials][0], mine[-1][1])
        for j, theirs in enumerate(calls):
            if j != i:
                assert all(end <= window[0] or start >= window[1] for start, end in theirs), \
                    f"step {j}'s answer ran inside step {i}'s timing loop: {window} {theirs}"
    for r in honest:  # a shared section, then the exclusive window; the wait for it is not run time
        assert 0 < r.wall_s["device_exclusive"] < r.wall_s["device_held"], r.wall_s
        assert r.wall_s["device_shared"] > 0, r.wall_s
    assert looping.error_kind == "timeout", looping
    assert looping.wall_s.get("reran_alone") == 1.0 and stats["rerun_alone"] == 1, (looping.wall_s, stats)


async def test_steps_of_a_task_started_together_time_its_reference_once(sandbox_cfg):
    """Three answers to one task evaluated at once, before any reference time is known: the first
    step to reach its timing window times the reference and reports it before the window goes
    back; the others get that time with their own window and do not time the reference again."""
    cfg = dataclasses.replace(sandbox_cfg, cpu_run_slots=3, max_concurrent=3, reference_samples=1)
    answers = [_LOGGING_ANSWER + f"\n# variant {i}\n" for i in range(3)]
    task = ADD + "\n# a task of its own: no reference time cached by an earlier test\n"
    async with SandboxPool(cfg) as pool:
        results = await asyncio.gather(*[pool.evaluate(task, a, "cpu") for a in answers])
    assert all(r.correct and r.timed for r in results), results
    assert sum("ref_timing" in r.wall_s for r in results) == 1, [r.wall_s for r in results]
    assert len({r.ref_runtime_ms for r in results}) == 1, [r.ref_runtime_ms for r in results]
    assert all(r.speedup == r.ref_runtime_ms / r.new_runtime_ms for r in results)


async def test_reference_per_step_times_the_reference_beside_every_answer(sandbox_cfg):
    """On a GPU shared with a trainer or an engine (pipeline.main sets ``reference_per_step``) a
    reference timed once is not timed under the load the answer met: every timed step times it
    again, even with a time known for the task (which still sizes the limits); by default the
    second step uses the known time (one sample here)."""
    task = ADD + "\n# a task of its own: reference_per_step\n"
    answers = [_LOGGING_ANSWER + f"\n# per-step variant {i}\n" for i in range(3)]
    once = dataclasses.replace(sandbox_cfg, reference_samples=1)
    async with SandboxPool(once) as pool:  # known: the first step times it, the next does not
        cached = [await pool.evaluate(task, a, "cpu") for a in answers[:2]]
        assert ["ref_timing" in r.wall_s for r in cached] == [True, False], [r.wall_s for r in cached]
        pool.cfg = dataclasses.replace(once, reference_per_step=True)
        again = [await pool.evaluate(task, a, "cpu") for a in answers[1:]]
    assert all(r.correct and r.timed and "ref_timing" in r.wall_s for r in again), [r.wall_s for r in again]
    assert all(r.speedup == r.ref_runtime_ms / r.new_runtime_ms for r in again)


async def test_waiting_steps_told_to_warm_answer_it_and_still_score(sandbox_cfg):
    """The warm exchange end to end (judge, both runners) on the host's gate: one step at a time
    (budget 1), the first told to warm although the device is free, the next two while they wait;
    each warms in its runners before admission (``wall_s["warm"]``, inside its ``device_wait``)
    and scores as it would have."""
    from sandbox.device_gate import DeviceGate

    cfg = dataclasses.replace(sandbox_cfg, cpu_run_slots=1, max_concurrent=3)
    answers = [_LOGGING_ANSWER + f"\n# warm {i}\n" for i in range(3)]
    async with SandboxPool(cfg) as pool:
        pool._cpu_gate = DeviceGate((None, "host"), 1, cfg.admission_overtake_s, warm_slots=2)
        results = await asyncio.gather(*[pool.evaluate(ADD, a, "cpu") for a in answers])
    assert all(r.correct and r.timed for r in results), [r.error for r in results]
    warmed = [r for r in results if "warm" in r.wall_s]
    assert len(warmed) == 3, [r.wall_s for r in results]   # the first too: admitted once it is warm
    assert all(r.wall_s["warm"] <= r.wall_s["device_wait"] + 0.002 for r in warmed), [r.wall_s for r in results]
    # the held window's end is measured in its parts: the judge's exit, the verdict to the memory back
    assert all(0 <= r.wall_s["judge_exit"] <= r.wall_s["device_tail"] + r.wall_s["device_held"] for r in results)
