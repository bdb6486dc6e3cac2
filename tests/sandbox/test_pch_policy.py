"""When the pool builds a precompiled header (a real g++ run; a bogus flag makes it fail fast)."""
import asyncio
import dataclasses

from sandbox.pool import EvalPool


async def test_a_flag_set_gets_a_pch_build_on_its_second_use_only_once(sandbox_cfg, tmp_path):
    cfg = dataclasses.replace(sandbox_cfg, precompiled_header=True, pch_min_builds=2, cache_dir=str(tmp_path))
    flags = ["-fno-such-flag-for-this-test"]
    async with EvalPool(cfg) as pool:
        pool._schedule_pch(flags)
        assert not pool._pch_building
        pool._schedule_pch(flags)
        pool._schedule_pch(flags)
        assert len(pool._pch_building) == 1
        await asyncio.gather(*pool._pch_building.values())
        assert pool.stats().get("pch_failed") == 1.0 and "pch_built" not in pool.stats()
    assert not [p for p in (tmp_path / "pch").iterdir() if not p.name.startswith(".")]


async def test_an_answer_that_includes_the_header_again_builds_with_the_pch(sandbox_cfg, tmp_path):
    """torch's main.cpp opens with #include <torch/extension.h> and a KernelBench answer's
    cpp_sources include it again. g++ serves only the first from the PCH; the second must still
    find a header in the PCH dir (before the forwarder every such build failed, scored 0)."""
    import json

    from rewards.solutions import load_solution
    from rewards.tasks.loader import load_builtin
    from sandbox import build

    answer = load_solution("cpu", "L1/17_relu")
    assert answer.count("#include <torch/extension.h>") == 1
    task = {t.id: t for t in load_builtin(profile="cpu")}["L1/17_relu"]
    build.build_pch(tmp_path / "pch", ["-O3", "-fopenmp"])  # what the pool builds after two uses
    cfg = dataclasses.replace(sandbox_cfg, precompiled_header=True, cache_dir=str(tmp_path))
    async with EvalPool(cfg) as pool:
        result = await pool.evaluate(task.source, "# built with the PCH\n" + answer, "cpu")
    assert result.correct, (result.error_kind, result.error)
    decisions = [json.loads(p.read_text()) for p in (tmp_path / "builds").rglob("relu_cpu.pch.json")]
    assert decisions and decisions[0]["pch_dir"] == str(build.build_pch(tmp_path / "pch", ["-O3", "-fopenmp"]))
