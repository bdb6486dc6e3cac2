"""Compile steps on other nodes of a Ray cluster (sandbox.build_pool=ray), on one box: a head
node without CPUs (the driver's), a node that builds, and a node whose compiler differs (CXX=g++
in its raylet's environment: part of every build key), which is refused. Real Ray nodes
(ray.cluster_utils.Cluster), real confined compile steps, real g++; each node keeps its build files
in a dir of its own (sandbox.ray_build_node_dir) bound at the cache path for its compile steps.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.build import build_key, build_tools, step_path
from sandbox.build_pool import key_parts
from sandbox.pool import SandboxPool
from tests.sandbox.conftest import fixture_source

ADD = fixture_source("tasks/add.py")
CAPI = fixture_source("answers/add_cpp_python_api.py")
# distinct text from every other test's answers, so the session cache never serves them
ANSWERS = [CAPI.replace("fixture_add_capi", f"fixture_ray_build_{i}") for i in range(2)]
BROKEN = ("from torch.utils.cpp_extension import load_inline\n"
          "load_inline('fixture_ray_broken', cpp_sources='int f() { return undeclared_on_node; }',\n"
          "            no_implicit_headers=True)\n"
          "class ModelNew:\n    pass\n")


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process (a multi-node cluster needs its own)")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    good = c.add_node(num_cpus=1)
    before = os.environ.get("CXX")
    os.environ["CXX"] = "g++"   # the raylet, and so its workers, inherit it: that node's key differs
    try:
        odd = c.add_node(num_cpus=1)
    finally:
        if before is None:
            del os.environ["CXX"]
        else:
            os.environ["CXX"] = before
    ray.init(address=c.address, log_to_driver=False)
    yield ray, good.node_id, odd.node_id, c
    ray.shutdown()
    c.shutdown()


def test_builds_run_on_another_node_come_back_and_score(cluster, sandbox_cfg, tmp_path, caplog):
    ray, good, odd, _ = cluster
    driver_node = ray.get_runtime_context().get_node_id()
    cfg = dataclasses.replace(sandbox_cfg, build_pool="ray", ray_build_workers=2, ray_build_cpus=1.0,
                              ray_build_node_dir=str(tmp_path / "node-{node}"), max_concurrent=3)

    async def go():
        async with SandboxPool(cfg) as pool:
            results = await asyncio.gather(*(pool.evaluate(ADD, a, "cpu") for a in ANSWERS),
                                           pool.evaluate(ADD, BROKEN, "cpu"))
            return results, pool.stats(), list(pool._builds.remote.refusals)

    results, stats, refusals = asyncio.run(go())
    *good_results, broken = results
    for res in good_results:
        assert res.correct and res.error_kind is None and not res.cache_hit, res
    assert broken.error_kind == "compile_error" and not broken.compiled, broken
    assert "undeclared_on_node" in (broken.error or "") + (broken.log_tail or ""), broken

    # every build ran on the node that builds, none on the driver's or the refused one
    assert stats.get(f"built_on/{good}") == 3, stats
    assert not any(k.startswith(f"built_on/{n}") for k in stats for n in (driver_node, odd)), stats
    assert stats["build_actors"] == 1 and stats["build_nodes_refused"] == 1, stats
    assert stats.get("remote_builds_made_here", 0) == 0, stats
    (refusal,) = refusals
    assert odd in refusal and "build key would differ" in refusal and "g++" in refusal, refusal
    assert any(odd in r.getMessage() for r in caplog.records), "the refusal is logged"

    cache = Path(cfg.cache_dir)
    for src in ANSWERS + [BROKEN]:
        bkey = build_key(src, "cpu", "", key_parts()["torch"], build_tools())
        verdict = json.loads((cache / "builds" / f"{bkey}.json").read_text())
        assert verdict["build_node"] == good, verdict
        # the files were made on the node's own disk, and arrived here
        assert (tmp_path / f"node-{good}" / "builds" / bkey).is_dir()
        if src is BROKEN:
            assert verdict["error_kind"] == "compile_error"
            continue
        name = next(p for p in (cache / "builds" / bkey).iterdir() if p.is_dir())
        assert list(name.glob("*.so")), list(name.iterdir())
        # built at the path it landed on (torch rewrites build.ninja with this path, and a build
        # made at another one is rebuilt), and up to date there: the run step had nothing to rebuild
        assert str(name / "main.cpp") in (name / "build.ninja").read_text()
        dry = subprocess.run(["ninja", "-n", "-C", str(name)], capture_output=True, text=True,
                             env={**os.environ, "PATH": step_path()})
        assert "no work to do" in dry.stdout, dry.stdout + dry.stderr


def test_a_lost_node_is_never_the_answers_fault_its_build_is_made_here(cluster, sandbox_cfg, tmp_path):
    ray, *_, c = cluster
    doomed = c.add_node(num_cpus=1, resources={"doomed_builder": 1})
    cfg = dataclasses.replace(sandbox_cfg, build_pool="ray", ray_build_workers=1, ray_build_resource="doomed_builder",
                              ray_build_node_dir=str(tmp_path / "node-{node}"))
    first, second = (CAPI.replace("fixture_add_capi", f"fixture_ray_lost_{i}") for i in range(2))

    async def go():
        async with SandboxPool(cfg) as pool:
            a = await pool.evaluate(ADD, first, "cpu")
            c.remove_node(doomed)   # its raylet and the build actor on it are gone
            b = await pool.evaluate(ADD, second, "cpu")
            return a, b, pool.stats()

    a, b, stats = asyncio.run(go())
    assert a.correct and b.correct, (a, b)
    assert stats.get(f"built_on/{doomed.node_id}") == 1, stats
    assert stats["remote_builds_lost"] == 1 and stats["remote_builds_made_here"] == 1, stats
    assert stats["compiles"] == 2, stats


def _tar(build: Path) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(build, arcname=".")
    return buf.getvalue()


def test_a_build_coming_back_lands_whole_with_exact_mtimes_or_is_the_answers_error(sandbox_cfg, tmp_path):
    from sandbox.build_pool import _mtimes, unpack_build

    cache, made = tmp_path / "cache", tmp_path / "made"
    (cache / "builds" / "k1").mkdir(parents=True)   # what a step's mkdir leaves: replaced, never merged
    (cache / "builds" / "k1" / "stale.o").write_text("old")
    (made / "ext").mkdir(parents=True)
    (made / "ext" / "main.o").write_bytes(b"\0" * 100)
    os.utime(made / "ext" / "main.o", ns=(1796610649240467909, 1796610649240467909))
    assert unpack_build(_tar(made), cache, "k1", sandbox_cfg, _mtimes(made)) is None
    assert sorted(p.name for p in (cache / "builds" / "k1").rglob("*")) == ["ext", "main.o"]
    assert (cache / "builds" / "k1" / "ext" / "main.o").stat().st_mtime_ns == 1796610649240467909
    assert not [p for p in (cache / "builds").iterdir() if p.name.startswith(".")]  # nothing left beside it

    (made / "ext" / "leak").symlink_to("/etc/passwd")   # a link out of the build dir
    problem = unpack_build(_tar(made), cache, "k2", sandbox_cfg, {})
    assert problem and "no build may leave" in problem and not (cache / "builds" / "k2").exists()
    (made / "ext" / "leak").unlink()
    small = dataclasses.replace(sandbox_cfg, max_build_dir_bytes=50)
    problem = unpack_build(_tar(made), cache, "k3", small, {})
    assert problem and "over the quota" in problem and not (cache / "builds" / "k3").exists()


def test_the_build_pool_keys_are_checked_by_name(tmp_path):
    from sandbox.config import load_default_config

    assert load_default_config().build_pool == "local"   # Ray only when asked for
    with pytest.raises(ValueError, match="sandbox.build_pool='remote'"):
        load_default_config(build_pool="remote")
    with pytest.raises(ValueError, match="sandbox.ray_build_workers=0"):
        load_default_config(build_pool="ray", ray_build_workers=0)
    # a local pool never imports Ray (a fresh interpreter: this one may have it already)
    probe = ("import sys; from sandbox.config import load_default_config; from sandbox.pool import SandboxPool; "
             f"SandboxPool(load_default_config(cache_dir={str(tmp_path)!r})); print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
