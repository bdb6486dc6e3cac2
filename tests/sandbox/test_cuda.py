"""The cuda backend on a real GPU (skipped without one): a subset of ``sandbox.selfcheck``."""
import pytest

from sandbox.selfcheck import cuda_cases, run_cases

KEEP = {"cuda_add_correct", "cuda_add_off_by_one", "cuda_illegal_memory_access", "cuda_correct_after_fault",
        "cuda_returns_uninitialised", "cuda_fake_event_timing", "triton_gpu_add_correct"}


@pytest.mark.gpu
async def test_cuda_selfcheck_rows_are_as_expected(kernel_cache_dir):
    cases = [c for c in cuda_cases() if c.name in KEEP]
    rows = await run_cases(cases, {"cache_dir": kernel_cache_dir, "run_timeout_s": 60, "timing_runs": 10})
    bad = [r for r in rows if r["case"] != "_stats" and not r["ok"]]
    assert not bad, bad
