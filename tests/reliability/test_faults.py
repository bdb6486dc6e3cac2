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


async def test_a_kernel_that_never_ends_is_cut_at_its_call_limit_once_the_reference_time_is_known(sandbox_cfg):
    """With the task's reference time known (an earlier step measured it), one call of the answer
    may take max(call_timeout_floor_s, factor x that time), its first call three times that: a
    never-ending forward ends as a timeout flagged call_over_limit after 3x the floor, far inside
    the step's 60 s limit, and is not run again alone."""
    hung = ("import torch.nn as nn\nTAG = 'call'\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
            "        while True:\n            pass\n")
    async with SandboxPool(dataclasses.replace(sandbox_cfg, reference_samples=1)) as pool:
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
