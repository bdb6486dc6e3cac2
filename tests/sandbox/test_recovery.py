"""A worker lost from outside (not by the pool, not by its candidate) is run again once."""
from __future__ import annotations

import asyncio
import os
import signal

from sandbox.launch import worker_processes
from sandbox.pool import SandboxPool
from tests.sandbox.conftest import fixture_source

SLOW_CORRECT = ("import time\nimport torch.nn as nn\n"
                "class ModelNew(nn.Module):\n"
                "    def forward(self, x):\n"
                "        time.sleep(0.5)\n"
                "        return x.clamp_min(0)\n")


async def _kill_first_worker() -> int:
    for _ in range(600):
        for child in worker_processes():
            try:
                await asyncio.sleep(1.0)  # let it start its harness
                os.kill(child.pid, signal.SIGKILL)
                return child.pid
            except ProcessLookupError:
                continue
        await asyncio.sleep(0.05)
    raise AssertionError("no worker process appeared")


async def test_a_lost_worker_is_retried_and_the_evaluation_still_completes(sandbox_cfg):
    async with SandboxPool(sandbox_cfg) as pool:
        killer = asyncio.ensure_future(_kill_first_worker())
        res = await pool.evaluate(fixture_source("tasks/relu.py"), SLOW_CORRECT, "cpu")
        await killer
        assert pool.stats()["lost_workers"] == 1
    assert res.correct, res


async def test_the_cuda_backend_without_a_gpu_is_a_sandbox_error_not_a_crash(sandbox_cfg):
    import shutil

    import pytest

    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU driver is present")
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(fixture_source("tasks/relu.py"), SLOW_CORRECT, "cuda")
    assert res.error_kind == "sandbox_error" and "GPU" in res.error and not res.correct
