"""Triton on CPU through the interpreter (TRITON_INTERPRET=1): correctness only, never timed."""
import pytest

from sandbox.pool import SandboxPool
from tests.sandbox.conftest import fixture_source


@pytest.mark.triton_interpreter
async def test_correct_triton_kernel_is_correct_but_not_timed(sandbox_cfg):
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(fixture_source("tasks/add.py"), fixture_source("answers/add_triton_correct.py"),
                                  "triton")
    assert res.correct and res.error_kind is None, res
    assert res.timed is False and res.speedup is None and res.new_runtime_ms is None
    assert res.device == "cpu"


@pytest.mark.triton_interpreter
async def test_triton_kernel_reducing_the_wrong_axis_is_wrong_output(sandbox_cfg):
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(fixture_source("tasks/rowsum.py"),
                                  fixture_source("answers/rowsum_triton_wrong_axis.py"), "triton")
    assert res.error_kind == "wrong_output" and res.which_output == 0, res


def test_an_interpreter_that_fails_argument_bounded_loops_is_named(monkeypatch):
    """Triton 3.6's interpreter with numpy 2.4 fails ``for s in range(0, n, BLOCK)`` where ``n`` is
    a kernel argument (seen with real triton 3.6.0 and numpy 2.4.6, 2026-12-05): the pool says so
    as its own failure, never as the answer's crash."""
    import importlib.metadata

    from sandbox import devices

    installed = {"triton": "3.6.0", "numpy": "2.4.6"}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: installed[name])
    try:
        devices.interpreter_problem.cache_clear()
        problem = devices.interpreter_problem()
        assert problem and "triton 3.6.0" in problem and "numpy 2.4.6" in problem and "numpy<2.4" in problem
        for triton, numpy in (("3.7.0", "2.4.6"), ("3.6.0", "2.3.5"), ("3.10.1", "3.0.0")):
            installed.update(triton=triton, numpy=numpy)
            devices.interpreter_problem.cache_clear()
            assert devices.interpreter_problem() is None, (triton, numpy)
    finally:
        devices.interpreter_problem.cache_clear()


async def test_the_pool_refuses_a_broken_interpreter_as_its_own_error(sandbox_cfg, monkeypatch):
    from sandbox import devices

    monkeypatch.setattr(devices, "interpreter_problem", lambda: "triton 3.6.0 with numpy 2.4.6 fails")
    monkeypatch.setattr(devices, "detect_gpus", lambda: [])
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(fixture_source("tasks/add.py"), fixture_source("answers/add_triton_correct.py"),
                                  "triton")
    assert res.error_kind == "sandbox_error" and "numpy 2.4.6" in res.error and not res.correct, res
