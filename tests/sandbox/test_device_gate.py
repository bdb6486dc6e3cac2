"""Run steps that hold a device (a GPU, or the host with ``cpu_run_slots``) prepare first and take it
only once ready: candidate code never runs in two of them at once, and the wait is not run time."""
from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path

from sandbox.pool import EvalPool
from tests.sandbox.conftest import fixture_source

ADD = fixture_source("tasks/add.py")

# Records when its code started and when it last ran a forward, in a file of its own under /dev/shm
# (writable inside the sandbox, shared with the test).
_LOGGING_ANSWER = """
import time, uuid
import torch.nn as nn

_LOG = "{log}/" + uuid.uuid4().hex  # not the pid: each candidate is pid 2 of its own namespace
_START = time.time()


class ModelNew(nn.Module):
    def forward(self, a, b):
        time.sleep(0.05)
        with open(_LOG, "w") as f:
            f.write(f"{{_START}} {{time.time()}}")
        return a + b
"""


async def test_gated_run_steps_never_overlap_and_do_not_count_the_wait(sandbox_cfg):
    log = Path("/dev/shm") / f"gate-test-{uuid.uuid4().hex[:8]}"
    log.mkdir()
    cfg = dataclasses.replace(sandbox_cfg, cpu_run_slots=1, max_concurrent=3)
    answers = [_LOGGING_ANSWER.format(log=log) + f"\n# variant {i}\n" for i in range(3)]
    try:
        async with EvalPool(cfg) as pool:
            results = await asyncio.gather(*[pool.evaluate(ADD, a, "cpu") for a in answers])
        spans = sorted(tuple(map(float, p.read_text().split())) for p in log.iterdir())
    finally:
        for p in log.iterdir():
            p.unlink()
        log.rmdir()
    assert all(r.correct and r.timed for r in results), results
    assert len(spans) == 3, spans
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, f"candidate code of two run steps overlapped: {spans}"
    # each step held the host for its own run, and the ones that waited say so
    assert all(r.wall_s["device_held"] > 0 for r in results), [r.wall_s for r in results]
    waits = sorted(r.wall_s["device_wait"] for r in results)
    assert waits[-1] >= min(r.wall_s["device_held"] for r in results) * 0.5, [r.wall_s for r in results]


async def test_ungated_cpu_run_steps_report_no_device_time(sandbox_cfg):
    async with EvalPool(sandbox_cfg) as pool:
        res = await pool.evaluate(ADD, fixture_source("answers/add_cpp_correct.py"), "cpu")
    assert res.correct, res
    assert "device_held" not in res.wall_s and "device_wait" not in res.wall_s
    assert res.wall_s["reference"] >= 0 and res.wall_s["check"] >= 0
