"""Run steps that hold a device (a GPU, or the host with ``cpu_run_slots``) prepare first and take it
only once ready: candidate code never runs in two of them at once, and the wait is not run time."""
from __future__ import annotations

import asyncio
import dataclasses

from sandbox.pool import EvalPool
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
    async with EvalPool(cfg) as pool:
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
    async with EvalPool(sandbox_cfg) as pool:
        res = await pool.evaluate(ADD, fixture_source("answers/add_cpp_correct.py"), "cpu")
    assert res.correct, res
    assert "device_held" not in res.wall_s and "device_wait" not in res.wall_s
    assert res.wall_s["correctness"] >= 0 and res.wall_s["timing"] >= 0
