"""Faults injected from outside into a batch of evaluations (real worker processes, SIGKILL):
a lost worker is run again once; lost twice, the evaluation is a score-0 sandbox_error naming the
loss; the other evaluations of the batch and the pool itself go on."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time

import psutil
import pytest

from rewards.config import load_reward_config
from rewards.score import score_result
from sandbox.launch import worker_processes
from sandbox.pool import SandboxPool
from tests.sandbox.conftest import fixture_source

RELU = fixture_source("tasks/relu.py")
CORRECT = fixture_source("answers/relu_python_correct.py")


def slow_correct(tag: str, sleep_s: float = 0.4) -> str:
    # the tag makes each candidate its own build key: no deduplication between them
    return ("import time\nimport torch.nn as nn\n"
            f"TAG = {tag!r}\n"
            "class ModelNew(nn.Module):\n"
            "    def forward(self, x):\n"
            f"        time.sleep({sleep_s})\n"
            "        return x.clamp_min(0)\n")


def workers() -> list[psutil.Process]:
    return worker_processes()  # started here, or forked by this process's zygotes


def kill(pids: list[int]) -> int:
    n = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except ProcessLookupError:
            pass
    return n


async def kill_workers_for(seconds: float, settle_s: float = 0.8) -> int:
    """Kill every worker process that has been up ``settle_s`` (inside its harness), for a while:
    each evaluation started meanwhile loses its worker twice."""
    killed, first_seen, end = 0, {}, time.monotonic() + seconds
    while time.monotonic() < end:
        now = time.monotonic()
        for w in workers():
            first_seen.setdefault(w.pid, now)
        ripe = [pid for pid, t in first_seen.items() if now - t >= settle_s]
        killed += kill(ripe)
        for pid in ripe:
            first_seen.pop(pid)
        await asyncio.sleep(0.05)
    return killed


async def test_one_worker_killed_mid_batch_is_retried_and_the_batch_completes(sandbox_cfg):
    async with SandboxPool(sandbox_cfg) as pool:
        batch = [asyncio.ensure_future(pool.evaluate(RELU, slow_correct(f"a{i}"), "cpu")) for i in range(4)]
        for _ in range(400):
            live = workers()
            if live:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        assert kill([live[0].pid]) == 1
        results = await asyncio.wait_for(asyncio.gather(*batch), timeout=240)
        assert pool.stats()["lost_workers"] == 1
    assert all(r.correct and r.error_kind is None for r in results), results


async def test_the_whole_pool_killed_mid_batch_scores_zero_with_the_reason_and_serves_again(sandbox_cfg):
    """Every worker is killed for a while (as if the pool's processes were all lost): each
    evaluation in flight is run again once, then ends as a sandbox_error with score 0."""
    reward_cfg = load_reward_config("kernel", backend="cpu")
    async with SandboxPool(sandbox_cfg) as pool:
        batch = [asyncio.ensure_future(pool.evaluate(RELU, slow_correct(f"b{i}", 1.0), "cpu")) for i in range(3)]
        killer = asyncio.ensure_future(kill_workers_for(30.0))
        results = await asyncio.wait_for(asyncio.gather(*batch), timeout=240)
        killer.cancel()
        assert pool.stats()["lost_workers"] >= 2 * len(batch)
        for r in results:
            assert r.error_kind == "sandbox_error" and "lost twice" in r.error, r
            assert score_result(r, reward_cfg).score == 0.0
        after = await asyncio.wait_for(pool.evaluate(RELU, CORRECT, "cpu"), timeout=120)
    assert after.correct, after


async def test_a_hung_evaluation_is_cut_and_does_not_stall_the_others(sandbox_cfg):
    hung = ("import torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
            "        while True:\n            pass\n")
    t0 = time.monotonic()
    async with SandboxPool(sandbox_cfg) as pool:
        fast = [asyncio.ensure_future(pool.evaluate(RELU, slow_correct(f"c{i}", 0.0), "cpu")) for i in range(3)]
        slow = asyncio.ensure_future(pool.evaluate(RELU, hung, "cpu", run_timeout_s=8.0))
        done_fast = await asyncio.wait_for(asyncio.gather(*fast), timeout=120)
        t_fast = time.monotonic() - t0
        res = await asyncio.wait_for(slow, timeout=120)
        t_all = time.monotonic() - t0
    assert all(r.correct for r in done_fast)
    assert res.error_kind == "timeout" and not res.correct, res
    assert t_all < 8.0 + 60.0, t_all  # cut by its own limit, not by the test's
    assert res.wall_s.get("total", 0.0) < 8.0 + 40.0, res.wall_s


@pytest.mark.parametrize("per_step", [False, True], ids=["pool_reference", "reference_per_step"])
async def test_a_kernel_that_never_ends_is_cut_at_its_call_limit_once_the_reference_time_is_known(sandbox_cfg, per_step):
    """With the task's reference time known (an earlier step measured it), one call of the answer
    may take max(call_timeout_floor_s, factor x that time), its first call three times that: a
    never-ending forward ends as a timeout flagged call_over_limit after 3x the floor, far inside
    the step's 60 s limit, and is not run again alone. Also where each step times its own reference
    (reference_per_step, the RL job's setting on a shared GPU), whose request carries no reference
    time: the judge's message once failed to format there, and the step was lost and run again."""
    hung = ("import torch.nn as nn\nTAG = 'call'\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
            "        while True:\n            pass\n")
    async with SandboxPool(dataclasses.replace(sandbox_cfg, reference_samples=1, reference_per_step=per_step)) as pool:
        first = await asyncio.wait_for(pool.evaluate(RELU, CORRECT, "cpu"), timeout=120)
        assert first.correct and first.ref_runtime_ms, first
        t0 = time.monotonic()
        res = await asyncio.wait_for(pool.evaluate(RELU, hung, "cpu", run_timeout_s=60.0,
                                                   call_timeout_floor_s=3.0), timeout=120)
        took = time.monotonic() - t0
        stats = pool.stats()
    assert res.error_kind == "timeout" and "call_over_limit" in res.flags, res
    assert "one call of the answer did not finish within 9 s" in res.error, res.error  # a first call: 3x the limit
    assert took < 30.0, took  # the step's own limit would be 60 s
    assert stats.get("rerun_alone", 0.0) == 0.0 and "reran_alone" not in res.wall_s
    assert stats.get("lost_workers", 0.0) == 0.0, stats


async def test_a_slow_answer_is_timed_in_the_calls_its_budget_holds(sandbox_cfg):
    """sandbox.timing_budget_s: an answer whose first timed call shows its warmup + timed calls
    would hold the device (here the host's timing slot) longer than the budget makes one warmup
    and as many timed calls as fit, at least 3; it stays correct, is flagged timing_cut, and its
    speedup is still measured against the reference. A fast answer is not cut."""
    from sandbox.run_timing import TIMING_CUT

    cfg = dataclasses.replace(sandbox_cfg, correctness_trials=1, warmup_runs=3, timing_runs=20, timing_budget_s=1.0)
    async with SandboxPool(cfg) as pool:
        fast = await asyncio.wait_for(pool.evaluate(RELU, slow_correct("fast", 0.0), "cpu"), timeout=120)
        slow = await asyncio.wait_for(pool.evaluate(RELU, slow_correct("slow", 0.25), "cpu"), timeout=120)
    assert fast.correct and TIMING_CUT not in fast.flags, fast
    assert slow.correct and TIMING_CUT in slow.flags, slow
    assert slow.speedup is not None and slow.speedup < 0.5, slow
    # 1 warmup + 3 timed calls of 0.25 s (int(1.0 / 0.25) - 1 = 3), not 3 + 20
    assert slow.wall_s["timing"] < 0.25 * 10, slow.wall_s


async def test_the_pool_says_what_its_evaluations_under_way_are_doing(sandbox_cfg):
    """SandboxPool.in_flight (the heartbeat's view of a step's reward tail): an evaluation is
    queued for a slot, then builds, then is at the device; the oldest one's age and stage; nothing
    once all are done."""
    cfg = dataclasses.replace(sandbox_cfg, max_concurrent=1, correctness_trials=1, warmup_runs=0, timing_runs=2)
    seen = []
    async with SandboxPool(cfg) as pool:
        assert pool.in_flight() == {"queued": 0.0, "build": 0.0, "run": 0.0}
        jobs = [asyncio.ensure_future(pool.evaluate(RELU, slow_correct(f"f{i}", 0.3), "cpu")) for i in range(2)]
        while not all(j.done() for j in jobs):
            seen.append(pool.in_flight())
            await asyncio.sleep(0.05)
        results = await asyncio.gather(*jobs)
        after = pool.in_flight()
    assert all(r.correct for r in results)
    assert any(s["run"] == 1 and s["queued"] == 1 for s in seen), seen  # one slot: the other waits
    assert any(s.get("oldest_stage") == 2.0 for s in seen), seen  # "run" (a Python answer builds in no time)
    assert all(s["queued"] + s["build"] + s["run"] <= 2 and s.get("oldest_s", 0) >= 0 for s in seen)
    ages = [s["oldest_s"] for s in seen if s["queued"] + s["build"] + s["run"] == 2]
    assert ages == sorted(ages) and ages[-1] > 0.3, ages  # the first one, ageing
    assert after == {"queued": 0.0, "build": 0.0, "run": 0.0}


async def test_a_kernel_that_never_ends_is_cut_at_its_call_limit_before_any_reference_time_is_known(sandbox_cfg):
    """A fresh pool knows no reference time (in an RL run a task stays so until an answer passes):
    the judge calls the reference once first and sizes the answer's call limit from it, so a
    never-ending forward is cut after 3x the floor, flagged call_over_limit and not re-run alone,
    rather than at the step's limit and then again alone."""
    hung = ("import torch.nn as nn\nTAG = 'fresh'\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
            "        while True:\n            pass\n")
    async with SandboxPool(sandbox_cfg) as pool:
        t0 = time.monotonic()
        res = await asyncio.wait_for(pool.evaluate(RELU, hung, "cpu", run_timeout_s=60.0, call_timeout_floor_s=3.0),
                                     timeout=150)
        took = time.monotonic() - t0
        stats = pool.stats()
    assert res.error_kind == "timeout" and "call_over_limit" in res.flags, res
    assert "one call of the answer did not finish within 9 s" in res.error and "x the reference's" in res.error, res.error
    assert "call_limit_ref" in res.wall_s, res.wall_s
    assert took < 30.0, took  # the step's own limit would be 60 s, then 60 more alone
    assert stats.get("rerun_alone", 0.0) == 0.0 and stats.get("lost_workers", 0.0) == 0.0, stats
