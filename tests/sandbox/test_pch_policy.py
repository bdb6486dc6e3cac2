"""When the pool builds a precompiled header (a real g++ run), and for which flag sets
(sandbox.build.PCH_FLAG_SETS only: the trusted builder refuses any other)."""
import asyncio
import dataclasses
import json

import pytest

from sandbox import build
from sandbox.pool import SandboxPool


@pytest.mark.parametrize("flags", [[], [""], ["-O3"], ["-O3", "-fopenmp"], ["-O3", "-ffast-math", "-march=native",
                                                                           "-fopenmp"]])
def test_project_flag_sets_may_get_a_pch(flags):
    assert build.pch_allowed(flags)


@pytest.mark.parametrize("flags", [["-wrapper", "/bin/sh,x"], ["-O3", "-wrapper", "/bin/sh,x"], ["-fopenmp", "-O3"],
                                   ["-O1"], ["-fno-such-flag-for-this-test"], "-O3", [3], None, {"-O3": 1}])
def test_any_other_flag_set_is_refused_by_the_trusted_builder(flags, tmp_path, capsys):
    assert not build.pch_allowed(flags)
    with pytest.raises(ValueError, match="PCH_FLAG_SETS"):
        build.build_pch(tmp_path / "pch", flags)
    with pytest.raises(ValueError, match="PCH_FLAG_SETS"):  # what the pool runs: refused before g++ starts
        build.main(["--pch-root", str(tmp_path / "pch"), "--cflags", json.dumps(flags)])
    assert not (tmp_path / "pch").exists()


def test_only_project_flag_sets_are_reported_as_wanted(tmp_path):
    wanted = []
    assert build._pch_for({"extra_cflags": ["-O3", "-funroll-loops"]}, str(tmp_path), wanted) is None
    assert build._pch_for({"extra_cflags": ["-O3"]}, str(tmp_path), wanted) is None
    assert build._pch_for({"extra_cflags": [""]}, str(tmp_path), wanted) is None
    assert wanted == [["-O3"], []]


async def test_a_flag_set_gets_a_pch_build_on_its_second_use_only_once(sandbox_cfg, tmp_path, monkeypatch):
    cfg = dataclasses.replace(sandbox_cfg, precompiled_header=True, pch_min_builds=2, cache_dir=str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # the builder's compiler fails at once: what is under test is the schedule
    flags = ["-O2"]
    async with SandboxPool(cfg) as pool:
        pool._builds.schedule_pch(flags)
        assert not pool._builds.pch_building
        pool._builds.schedule_pch(flags)
        pool._builds.schedule_pch(flags)
        assert len(pool._builds.pch_building) == 1
        await asyncio.gather(*pool._builds.pch_building.values())
        assert pool.stats().get("pch_failed") == 1.0 and "pch_built" not in pool.stats()
        for _ in range(3):  # a flag set outside PCH_FLAG_SETS is never built, however often it is asked for
            pool._builds.schedule_pch(["-fno-such-flag-for-this-test"])
        assert not [k for k in pool._builds.pch_building if "no-such" in k]
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
    async with SandboxPool(cfg) as pool:
        result = await pool.evaluate(task.source, "# built with the PCH\n" + answer, "cpu")
    assert result.correct, (result.error_kind, result.error)
    decisions = [json.loads(p.read_text()) for p in (tmp_path / "builds").rglob("relu_cpu.pch.json")]
    assert decisions and decisions[0]["pch_dir"] == str(build.build_pch(tmp_path / "pch", ["-O3", "-fopenmp"]))
