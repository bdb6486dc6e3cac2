"""Triton on CPU through the interpreter (TRITON_INTERPRET=1): correctness only, never timed."""
from sandbox.pool import EvalPool
from tests.sandbox.conftest import fixture_source


async def test_correct_triton_kernel_is_correct_but_not_timed(sandbox_cfg):
    async with EvalPool(sandbox_cfg) as pool:
        res = await pool.evaluate(fixture_source("tasks/add.py"), fixture_source("answers/add_triton_correct.py"),
                                  "triton")
    assert res.correct and res.error_kind is None, res
    assert res.timed is False and res.speedup is None and res.new_runtime_ms is None
    assert res.device == "cpu"


async def test_triton_kernel_reducing_the_wrong_axis_is_wrong_output(sandbox_cfg):
    async with EvalPool(sandbox_cfg) as pool:
        res = await pool.evaluate(fixture_source("tasks/rowsum.py"),
                                  fixture_source("answers/rowsum_triton_wrong_axis.py"), "triton")
    assert res.error_kind == "wrong_output" and res.which_output == 0, res
