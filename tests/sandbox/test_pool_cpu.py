"""The cpu backend end to end: real g++ builds through load_inline, real worker processes.

Cold builds in this module: add (correct), rowsum (off by one), one variant for the cache/dedupe
test (a compile error without torch headers takes a second). Everything else hits the session cache.
"""
from __future__ import annotations

import asyncio
import dataclasses

from sandbox.pool import SandboxPool
from tests.sandbox.conftest import fixture_source

ADD = fixture_source("tasks/add.py")
ADD_CPP = fixture_source("answers/add_cpp_correct.py")
ROWSUM = fixture_source("tasks/rowsum.py")
ROWSUM_OBO = fixture_source("answers/rowsum_cpp_off_by_one.py")


async def test_correct_cpp_openmp_answer_is_correct_and_timed(sandbox_cfg):
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(ADD, ADD_CPP, "cpu", key="add-cpp")
    assert res.correct and res.error_kind is None, res
    assert res.compiled and res.stage == "done"
    assert res.trials_passed == res.trials == sandbox_cfg.correctness_trials
    assert res.timed and res.ref_runtime_ms > 0 and res.new_runtime_ms > 0
    assert abs(res.speedup - res.ref_runtime_ms / res.new_runtime_ms) < 1e-9
    assert res.max_abs_err == 0.0


async def test_off_by_one_reduction_is_wrong_output_with_its_error(sandbox_cfg):
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(ROWSUM, ROWSUM_OBO, "cpu")
    assert res.compiled and not res.correct, res
    assert res.error_kind == "wrong_output" and res.which_output == 0
    assert res.max_abs_err > 1e-3 and res.trials_passed == 0
    assert not res.timed and res.speedup is None


async def test_a_cpp_compile_error_is_reported_and_cached(sandbox_cfg):
    # No torch header, so g++ fails in a second instead of after parsing torch/extension.h.
    broken = ("from torch.utils.cpp_extension import load_inline\n"
              "load_inline('fixture_broken', cpp_sources='int f() { return undeclared_thing; }',\n"
              "            no_implicit_headers=True)\n"
              "class ModelNew:\n    pass\n")
    async with SandboxPool(sandbox_cfg) as pool:
        first = await pool.evaluate(ADD, broken, "cpu")
        again = await pool.evaluate(ADD, broken, "cpu")
    assert first.error_kind == "compile_error" and not first.compiled, first
    assert "undeclared_thing" in first.error or "undeclared_thing" in first.log_tail
    assert again.error_kind == "compile_error" and again.cache_hit


async def test_a_refused_build_argument_comes_back_flagged(sandbox_cfg):
    # the build hook refuses before anything is built: the sandbox's kind, and the flag rewards reads
    refused = ("from torch.utils.cpp_extension import load_inline\n"
               "load_inline('fixture_refused', cpp_sources='int f() { return 0; }', no_implicit_headers=True,\n"
               "            extra_cflags=['-wrapper', '/bin/sh'])\n"
               "class ModelNew:\n    pass\n")
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(ADD, refused, "cpu")
    assert res.error_kind in ("compile_error", "load_error") and not res.compiled, res
    assert "disallowed build argument" in res.error and res.flags == ["disallowed_build_argument"]


async def test_identical_concurrent_candidates_build_once_and_repeat_is_a_fast_cache_hit(sandbox_cfg):
    variant = ADD_CPP + "\n# cache-test variant\n"
    cfg = dataclasses.replace(sandbox_cfg, max_concurrent=3)
    async with SandboxPool(cfg) as pool:
        a, b = await asyncio.gather(pool.evaluate(ADD, variant, "cpu"), pool.evaluate(ADD, variant, "cpu"))
        c = await pool.evaluate(ADD, variant, "cpu")
        stats = pool.stats()
    assert a.correct and b.correct and c.correct, (a, b, c)
    assert stats["compiles"] == 1, stats
    assert stats["deduplicated_builds"] == 1 and stats["cache_hits"] >= 1, stats
    assert sorted([a.cache_hit, b.cache_hit]) == [False, True]
    assert c.cache_hit
    cold = max(a.wall_s["total"], b.wall_s["total"])
    assert c.wall_s["total"] < cold / 3, (c.wall_s, cold)
    assert stats["compile_s_p50"] > 0 and stats["evals_per_min"] > 0
    # c times the reference itself: two of the task's reference_samples (3) steps timed it so far
    assert c.timed and "ref_timing" in c.wall_s, c.wall_s


async def test_a_cache_hit_loads_without_rebuilding_whichever_ninja_the_parent_path_finds(sandbox_cfg, monkeypatch):
    # a run started with the venv activated builds with its ninja; one started without it used to
    # find the system's, whose reading of the newer ninja's log called every cached build dirty:
    # each run step rebuilt it in its throw-away overlay (~44 s a "cache hit", 2026-12-05)
    import os
    import sys

    async with SandboxPool(sandbox_cfg) as pool:
        first = await pool.evaluate(ADD, ADD_CPP, "cpu", key="add-cpp")
    here = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != here))
    async with SandboxPool(sandbox_cfg) as pool:
        again = await pool.evaluate(ADD, ADD_CPP, "cpu", key="add-cpp")
    assert first.correct and again.correct and again.cache_hit, (first, again)
    assert again.wall_s["load"] < 5.0, again.wall_s


def test_build_keys_name_the_build_tools_and_steps_find_the_interpreters_ninja():
    import os
    import sys

    from sandbox.build import build_key, build_tools, step_path

    assert build_key("src", "cpu", "", "2.13") != build_key("src", "cpu", "", "2.13", "ninja=/usr/bin/ninja:1.11.1")
    here = os.path.dirname(sys.executable)
    path = step_path("/usr/bin:/bin")
    if sys.prefix != sys.base_prefix and os.path.isfile(os.path.join(here, "ninja")):
        assert path.split(os.pathsep)[0] == here and "/usr/bin" in path.split(os.pathsep)
        assert f"ninja={os.path.join(here, 'ninja')}:" in build_tools(path)
    else:
        assert path == "/usr/bin:/bin"
