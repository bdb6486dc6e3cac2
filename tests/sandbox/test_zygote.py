"""Host run steps forked from a pre-imported zygote (sandbox/zygote.py): the same verdict and the same
confinement as a fresh worker, nothing carried from one step to the next, a dead zygote replaced
without losing a step, and a fresh worker wherever the zygote cannot fork safely."""
from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest

from sandbox.pool import SandboxPool
from tests.sandbox import test_adversarial as adversarial
from tests.sandbox import test_verdict_line as verdict_line
from tests.sandbox.conftest import fixture_source

RELU = fixture_source("tasks/relu.py")
CORRECT = fixture_source("answers/relu_python_correct.py")
# the task's own Model as the answer: nothing to build, so the step is what a build-cache hit costs
CACHE_HIT = f"{RELU}\nModelNew = Model\n"


@pytest.fixture
def zygote_cfg(sandbox_cfg):
    return dataclasses.replace(sandbox_cfg, zygote_worker=True)


def _zygote_pids(pool: SandboxPool) -> list[int]:
    return [z.proc.pid for z in pool._launcher.zygotes.by_env.values() if z.alive and z.proc is not None]


async def test_a_cache_hit_through_the_zygote_equals_the_fresh_workers(sandbox_cfg):
    results = {}
    for forked in (False, True):
        async with SandboxPool(dataclasses.replace(sandbox_cfg, zygote_worker=forked)) as pool:
            results[forked] = [await pool.evaluate(RELU, CACHE_HIT, "cpu") for _ in range(2)]
            assert len(_zygote_pids(pool)) == int(forked)
    fresh, forked = results[False][-1], results[True][-1]
    for res in (fresh, forked):
        assert res.correct and res.timed and res.error_kind is None, res
    assert forked.isolation == fresh.isolation
    assert "own_session" in forked.isolation and "seccomp" in forked.isolation
    same = ("flags", "max_abs_err", "trials_passed", "stage")
    assert [getattr(forked, k) for k in same] == [getattr(fresh, k) for k in same]
    # the child found torch imported; a fresh worker imports it (>1 s on any machine this runs on)
    assert forked.wall_s["judge_imports"] < 0.2 < fresh.wall_s["judge_imports"], (forked.wall_s, fresh.wall_s)


async def test_nothing_one_step_sets_reaches_the_next(zygote_cfg):
    # The first answer marks modules of every process it can reach (its own, at import); the second
    # fails if it finds any mark. Both run in children of one zygote.
    marking = adversarial.candidate(
        "import sandbox, sys\n"
        "torch._zygote_mark = 1\nsandbox._zygote_mark = 1\nos.environ['ZYGOTE_MARK'] = '1'\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0)\n")
    checking = adversarial.candidate(
        "import sandbox\n"
        "found = [n for n, m in (('torch', torch), ('sandbox', sandbox)) if hasattr(m, '_zygote_mark')]\n"
        "found += ['environ'] if 'ZYGOTE_MARK' in os.environ else []\n"
        "if found:\n    raise RuntimeError(f'left by an earlier step: {found}')\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0)\n")
    async with SandboxPool(zygote_cfg) as pool:
        first = await pool.evaluate(RELU, marking, "cpu")
        zygotes = _zygote_pids(pool)
        second = await pool.evaluate(RELU, checking, "cpu")
        assert _zygote_pids(pool) == zygotes and len(zygotes) == 1
    assert first.correct, first
    assert second.correct, second


async def test_a_killed_zygote_is_replaced_and_no_step_is_lost(zygote_cfg):
    async with SandboxPool(zygote_cfg) as pool:
        assert (await pool.evaluate(RELU, CORRECT, "cpu")).correct
        [old] = _zygote_pids(pool)
        os.kill(old, signal.SIGKILL)
        time.sleep(0.2)  # dead before the pool's loop runs again: the next step finds it so
        res = await pool.evaluate(RELU, CORRECT, "cpu")
        assert res.correct, res
        after = await pool.evaluate(RELU, CORRECT, "cpu")
        assert after.correct, after
        [new] = _zygote_pids(pool)
        assert new != old and pool._launcher.zygotes.starts == 2
        assert after.wall_s["judge_imports"] < 0.2, after.wall_s
        assert pool.stats().get("lost_workers", 0) == 0


async def test_where_the_zygote_cannot_fork_safely_steps_get_fresh_workers(zygote_cfg):
    # OMP_NUM_THREADS > 1 makes torch's import start a second thread: the zygote refuses to fork
    # (a fork copies only the calling thread, and whatever locks the other held), once for good
    async with SandboxPool(dataclasses.replace(zygote_cfg, cpu_threads=2)) as pool:
        first = await pool.evaluate(RELU, CORRECT, "cpu")
        second = await pool.evaluate(RELU, CORRECT, "cpu")
        zygotes = pool._launcher.zygotes
        assert zygotes.starts == 1 and not zygotes.by_env
    for res in (first, second):
        assert res.correct, res
        assert res.wall_s["judge_imports"] > 0.2, res.wall_s


# The confinement tests that go through a real step, with the zygote on (whatever the default is)

async def test_zygote_children_cannot_see_the_parents_secrets(zygote_cfg, monkeypatch):
    await adversarial.test_secrets_in_the_parent_environment_are_invisible(zygote_cfg, monkeypatch)


async def test_zygote_children_cannot_write_outside_their_dirs(zygote_cfg, tmp_path):
    await adversarial.test_writes_outside_its_own_directories_are_refused(zygote_cfg, tmp_path)


async def test_zygote_children_cannot_reach_the_network(zygote_cfg):
    await adversarial.test_the_network_is_unreachable(zygote_cfg)


@pytest.mark.parametrize("pid_namespace", [True, False], ids=["pidns", "no-pidns"])
async def test_zygote_childrens_leftover_processes_are_killed(zygote_cfg, pid_namespace):
    # without a PID namespace only the marker the child wrote into its environment block finds them
    await adversarial.test_background_processes_left_behind_are_killed(zygote_cfg, pid_namespace)


async def test_zygote_children_cannot_touch_their_harness(zygote_cfg):
    await adversarial.test_the_candidate_cannot_write_its_harness_proc_files_or_signal_it(zygote_cfg)


async def test_zygote_children_run_with_glibcs_per_thread_cache_off(zygote_cfg):
    await adversarial.test_candidates_run_with_glibcs_per_thread_cache_off(zygote_cfg)


async def test_zygote_children_cannot_find_the_step_key(zygote_cfg, monkeypatch):
    await verdict_line.test_the_key_is_nowhere_the_candidate_can_read(zygote_cfg, monkeypatch)


def test_a_loaded_driver_library_is_not_a_started_driver(tmp_path):
    # GPU steps fork only from a zygote that has not started the GPU driver. Mapping a library named
    # libcuda (what `import torch` does on some machines) is reported but is not starting it; an
    # open device file is (cuInit opens /dev/nvidiactl): here a file under a stand-in prefix
    import subprocess
    import sys

    lib = tmp_path / "libcuda.so.1"
    src = tmp_path / "stub.c"
    src.write_text("int sbx_test_symbol(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    dev = tmp_path / "nvidiactl"
    dev.write_text("")
    prefix = str(tmp_path / "nvidia")
    code = ("import ctypes, sys\nfrom sandbox.zygote import driver_loaded, driver_started\n"
            f"row = [driver_loaded(), driver_started({prefix!r})]\n"
            f"ctypes.CDLL({str(lib)!r})\nrow += [driver_loaded(), driver_started({prefix!r})]\n"
            f"f = open({str(dev)!r})\nrow += [driver_started({prefix!r}), driver_started()]\nprint(*row)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True", "False", "True", "False"], out


@pytest.mark.gpu
async def test_a_gpu_step_forked_from_the_zygote_equals_a_fresh_workers(sandbox_cfg):
    # On a GPU machine: the same verdict through both kinds of worker, and the forked one skipped the
    # import; the zygote's driver check passed (it served the GPU step)
    from rewards.tasks.loader import load_builtin

    task = {t.id: t for t in load_builtin(profile="full")}["L1/17_relu"]
    answer = f"{task.source}\nModelNew = Model\n"
    results = {}
    for forked in (False, True):
        cfg = dataclasses.replace(sandbox_cfg, zygote_worker=forked, zygote_gpu_steps=forked)
        async with SandboxPool(cfg) as pool:
            results[forked] = [await pool.evaluate(task.source, answer, "cuda") for _ in range(2)]
            assert len(_zygote_pids(pool)) == int(forked)
    fresh, forked = results[False][-1], results[True][-1]
    for res in (fresh, forked):
        assert res.correct and res.timed and res.error_kind is None, res
    assert forked.isolation == fresh.isolation
    assert forked.wall_s["judge_imports"] < 0.2 < fresh.wall_s["judge_imports"], (forked.wall_s, fresh.wall_s)
