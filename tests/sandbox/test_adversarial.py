"""Runtime tricks against the sandbox (real worker processes, pure-Python candidates: no compiles).

Every case must end in a score-relevant verdict, and the pool must serve a correct evaluation
right after it.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import textwrap
import time

import psutil
import pytest

from sandbox.pool import EvalPool
from tests.sandbox.conftest import fixture_source

RELU = fixture_source("tasks/relu.py")
CORRECT = fixture_source("answers/relu_python_correct.py")

HEADER = "import os, sys, time, ctypes, threading\nimport torch\nimport torch.nn as nn\n"


def candidate(body: str) -> str:
    return HEADER + textwrap.dedent(body)


def forward(code: str, init: str = "") -> str:
    """A ModelNew whose forward runs ``code`` (which must return or raise)."""
    init_block = textwrap.indent(textwrap.dedent(init) or "pass", " " * 8)
    return candidate(
        "class ModelNew(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"{init_block}\n"
        "    def forward(self, x):\n"
        f"{textwrap.indent(textwrap.dedent(code), ' ' * 8)}\n")


CASES = {
    "segfault": (forward("ctypes.string_at(0)\nreturn x"), "runtime_error", "SIGSEGV"),
    "infinite_loop_in_forward": (forward("while True:\n    pass"), "timeout", None),
    "infinite_loop_at_import": (candidate("while True:\n    pass\nclass ModelNew(nn.Module):\n    pass\n"),
                                "timeout", None),
    "memory_hog_bytearray": (forward("hog = bytearray(64 * 2**30)\nreturn x"), "memory_limit", None),
    "memory_hog_growing": (forward("hog = []\nwhile True:\n    hog.append(torch.empty(2**28))"),
                           "memory_limit", None),
    "fork_bomb": (forward("while True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
                  "runtime_error", "processes"),
    "sys_exit_in_forward": (forward("sys.exit(3)"), "runtime_error", "SystemExit"),
    "os_exit_in_forward": (forward("os._exit(0)"), "runtime_error", "exited with code 0"),
    "raise_in_init": (forward("return x", init="raise ValueError('no init for you')"), "runtime_error",
                      "no init for you"),
    "wrong_shape": (forward("return x.clamp_min(0)[:, :-1]"), "wrong_output", "shape"),
    "wrong_dtype": (forward("return x.clamp_min(0).double()"), "wrong_output", "dtype"),
    "nan_output": (forward("y = x.clamp_min(0)\ny[0, 0] = float('nan')\nreturn y"), "wrong_output", "NaN"),
    "constant_output": (forward("return torch.zeros_like(x)"), "wrong_output", "max abs error"),
    "returns_its_input": (forward("return x"), "wrong_output", "max abs error"),
    "returns_uninitialised_memory": (forward("return torch.empty_like(x)"), "wrong_output", "NaN"),
    "reuses_previous_output": (forward("if self.last is None:\n    self.last = x.clamp_min(0)\nreturn self.last",
                                       init="self.last = None"), "wrong_output", "trial 1"),
    "fills_output_after_returning": (forward(
        "out = torch.zeros_like(x)\n"
        "def later():\n    time.sleep(0.05)\n    out.copy_(x.clamp_min(0))\n"
        "threading.Thread(target=later).start()\nreturn out"), "wrong_output", "max abs error"),
    "patches_torch_to_corrupt_the_reference": (candidate(
        "torch.relu = lambda t: torch.zeros_like(t)\n"
        "torch.Tensor.relu = lambda t: torch.zeros_like(t)\n"
        "torch.nn.functional.relu = lambda t, inplace=False: torch.zeros_like(t)\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"),
        "wrong_output", "max abs error"),
    "overrides_the_aten_kernel_to_corrupt_the_reference": (candidate(
        "_lib = torch.library.Library('aten', 'IMPL')\n"
        "_lib.impl('relu', lambda t: torch.zeros_like(t), 'CPU')\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"),
        "wrong_output", "max abs error"),
    "no_model_new": (candidate("class Model(nn.Module):\n    pass\n"), "load_error", "ModelNew"),
    "syntax_error": (candidate("class ModelNew(nn.Module)\n    pass\n"), "load_error", "SyntaxError"),
    "raises_at_import": (candidate("raise ImportError('missing dependency')\n"), "load_error", "missing dependency"),
    "returns_not_a_tensor": (forward("return [1, 2, 3]"), "wrong_output", "int"),
}


async def _evaluate(cfg, src, **kw):
    async with EvalPool(cfg) as pool:
        return await pool.evaluate(RELU, src, "cpu", **kw)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_trick_gets_a_verdict_and_the_pool_still_serves(name, sandbox_cfg):
    src, kind, needle = CASES[name]
    # A growing hog reaches the limit in 1 GiB steps, and every host allocation of a correctness run
    # is NaN-filled by glibc (M_PERTURB): 1.3-3.7 s a step on this 2-core VM, so it gets more time.
    limit = 30.0 if name.startswith("memory_hog") else 6.0
    async with EvalPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu", run_timeout_s=limit)
        assert res.correct is False, res
        assert res.error_kind == kind, res
        if needle:
            assert needle in (res.error or ""), res
        after = await pool.evaluate(RELU, CORRECT, "cpu")
        assert after.correct, after


async def test_spam_on_stdout_is_dropped_and_costs_only_its_tail(sandbox_cfg):
    src = forward("for _ in range(300):\n    print('x' * 2**20)\nreturn x.clamp_min(0)")
    async with EvalPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu")
    assert res.correct, res
    assert 0 < len(res.log_tail) <= sandbox_cfg.output_tail_bytes


async def test_timers_replaced_by_the_candidate_do_not_change_its_recorded_time(sandbox_cfg):
    src = candidate(
        "time.perf_counter = lambda: 0.0\n"
        "time.perf_counter_ns = lambda: 0\n"
        "torch.cuda.Event = None\n"
        "class ModelNew(nn.Module):\n"
        "    def forward(self, x):\n"
        "        time.sleep(0.03)\n"
        "        return x.clamp_min(0)\n")
    async with EvalPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu")
    assert res.correct and res.timed, res
    assert res.new_runtime_ms >= 25.0, res
    assert res.speedup < 1.0


async def test_secrets_in_the_parent_environment_are_invisible(sandbox_cfg, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "fake-secret-wandb")
    monkeypatch.setenv("HF_TOKEN", "fake-secret-hf")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret-aws")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "fake-secret-other")
    # The candidate looks in its own environment and in every process it can see.
    src = forward(
        "seen = [k for k, v in os.environ.items() if 'fake-secret' in v]\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        if b'fake-secret' in open(f'/proc/{pid}/environ', 'rb').read():\n"
        "            seen.append(pid)\n"
        "    except OSError:\n"
        "        pass\n"
        "if seen:\n    raise RuntimeError(f'saw secrets: {seen}')\n"
        "return x.clamp_min(0)")
    async with EvalPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu")
    assert res.correct, res


async def test_writes_outside_its_own_directories_are_refused(sandbox_cfg, tmp_path):
    target = tmp_path / "planted.txt"
    other_build = os.path.join(sandbox_cfg.cache_dir, "builds", "someone-else")
    os.makedirs(other_build, exist_ok=True)
    src = forward(
        f"open({str(target)!r}, 'w').write('x')\n"
        f"open(os.path.join({other_build!r}, 'evil.so'), 'w').write('x')\n"
        "return x.clamp_min(0)")
    async with EvalPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu")
    assert "landlock_fs" in res.isolation
    assert res.error_kind == "runtime_error" and "Permission" in res.error, res
    assert not target.exists()
    assert not os.path.exists(os.path.join(other_build, "evil.so"))


async def test_the_network_is_unreachable(sandbox_cfg):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    src = forward(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nreturn x.clamp_min(0)")
    try:
        async with EvalPool(sandbox_cfg) as pool:
            res = await pool.evaluate(RELU, src, "cpu")
    finally:
        server.close()
    assert res.error_kind == "runtime_error", res
    assert "netns" in res.isolation or "landlock_tcp" in res.isolation


@pytest.mark.parametrize("pid_namespace", [True, False], ids=["pidns", "no-pidns"])
async def test_background_processes_left_behind_are_killed(sandbox_cfg, pid_namespace):
    # Without a PID namespace (no root, no user namespaces) the environment-marker sweep does it.
    sandbox_cfg = dataclasses.replace(sandbox_cfg, pid_namespace=pid_namespace)
    marker = f"{time.time_ns() % 10**9}.25"
    src = forward(
        "import subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execvp('sleep', ['sleep', '{marker}'])\n"
        "return x.clamp_min(0)")
    async with EvalPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu")
    assert res.correct, res
    assert ("pidns" in res.isolation) == pid_namespace
    time.sleep(0.5)
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert left == []


async def test_a_thread_named_through_proc_as_the_cuda_driver_does_still_evaluates(sandbox_cfg):
    # NVIDIA's driver (570+) names its threads by writing /proc/<pid>/task/<tid>/comm from another
    # thread and fails cuInit (error 304) if it cannot: the run step's own threads must stay writable.
    src = forward(
        "import threading\n"
        "t = threading.Thread(target=time.sleep, args=(0.5,)); t.start()\n"
        "open(f'/proc/self/task/{t.native_id}/comm', 'w').write('cuda-EvtHandlr')\n"
        "name = open(f'/proc/self/task/{t.native_id}/comm').read().strip(); t.join()\n"
        "assert name == 'cuda-EvtHandlr', name\n"
        "return x.clamp_min(0)")
    res = await _evaluate(sandbox_cfg, src)
    assert res.correct, res
    assert "landlock_fs" in res.isolation, res.isolation


async def test_the_candidate_cannot_write_its_harness_proc_files_or_signal_it(sandbox_cfg):
    # its own /proc/<pid>/task is the one procfs tree it may write; the harness is its parent
    src = forward(
        "import signal\n"
        "harness = os.getppid()\n"
        "errors = []\n"
        "for path in (f'/proc/{harness}/task/{harness}/comm', f'/proc/{harness}/comm', '/proc/sys/kernel/hostname'):\n"
        "    try:\n"
        "        open(path, 'w').write('owned')\n"
        "    except OSError as e:\n"
        "        errors.append(e.errno)\n"
        "try:\n"
        "    os.kill(harness, signal.SIGSTOP)\n"
        "except OSError as e:\n"
        "    errors.append(e.errno)\n"
        "if len(errors) < 4:\n"
        "    raise RuntimeError(f'only {len(errors)} of 4 refused')\n"
        "return x.clamp_min(0)")
    res = await _evaluate(sandbox_cfg, src)
    if "landlock_signal_scope" not in res.isolation:
        pytest.skip("Landlock scopes (ABI 6) are not available here")
    assert res.correct, res
