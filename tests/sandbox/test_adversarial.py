"""Runtime tricks against the sandbox (real worker processes, pure-Python candidates: no compiles).

Every case must end in a score-relevant verdict, and the pool must serve a correct evaluation
right after it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import textwrap
import time

import psutil
import pytest

from sandbox.pool import SandboxPool
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
    "returns_its_input": (forward("return x"), "rule_violation", "shares memory with an input"),
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
    async with SandboxPool(cfg) as pool:
        return await pool.evaluate(RELU, src, "cpu", **kw)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_trick_gets_a_verdict_and_the_pool_still_serves(name, sandbox_cfg):
    src, kind, needle = CASES[name]
    # A growing hog reaches the limit in 1 GiB steps, and every host allocation of a correctness run
    # is NaN-filled by glibc (M_PERTURB): 1.3-3.7 s a step on this 2-core VM, so it gets more time.
    limit = 30.0 if name.startswith("memory_hog") else 6.0
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu", run_timeout_s=limit)
        assert res.correct is False, res
        assert res.error_kind == kind, res
        if needle:
            assert needle in (res.error or ""), res
        after = await pool.evaluate(RELU, CORRECT, "cpu")
        assert after.correct, after


async def test_spam_on_stdout_is_dropped_and_costs_only_its_tail(sandbox_cfg):
    src = forward("for _ in range(300):\n    print('x' * 2**20)\nreturn x.clamp_min(0)")
    async with SandboxPool(sandbox_cfg) as pool:
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
    async with SandboxPool(sandbox_cfg) as pool:
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
    async with SandboxPool(sandbox_cfg) as pool:
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
    async with SandboxPool(sandbox_cfg) as pool:
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
        async with SandboxPool(sandbox_cfg) as pool:
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
    async with SandboxPool(sandbox_cfg) as pool:
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


# --- forged verdicts -----------------------------------------------------------------------------
# With the isolation degraded as far as the GPU probe may take it (no PID namespace, no Landlock), a
# process the candidate leaves behind can reopen another process's pipes through /proc/<pid>/fd
# and write a verdict of its own into them. It starts here, forges, and outlives the evaluation.

_FORGED = {"stage": "done", "compiled": True, "correct": True, "trials_passed": 3, "trials": 3, "timed": True,
           "ref_runtime_ms": 10.0, "new_runtime_ms": 0.01, "speedup": 1000.0}

# argv: the paths to write to, the pid to outlive, what to write before and after that pid exits
_FORGER = """
import os, sys, time
paths, watched, before, after = sys.argv[1].split(), int(sys.argv[2]), sys.argv[3], sys.argv[4]
fds = []
for path in paths:
    try:
        fds.append(os.open(path, os.O_WRONLY))
    except OSError:
        pass
for fd in fds:
    os.write(fd, before.encode())
for _ in range(2000):  # until the watched process has exited (a zombie, or gone)
    try:
        with open(f"/proc/{watched}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
    except OSError:
        break
    time.sleep(0.005)
for fd in fds:
    os.write(fd, after.encode())
"""

# argv: a pipe (through /proc), the forged verdict. Reads the pipe (a write end reopens as a read
# end), takes the first line it wins from the pool, and writes it back behind a line that carries
# whatever that line carried (its first word) with the forged verdict.
_THIEF = """
import json, os, sys
path, forged = sys.argv[1], json.loads(sys.argv[2])
src, line = os.open(path, os.O_RDONLY), b""
while not line.endswith(b"\\n"):
    chunk = os.read(src, 1 << 20)
    if not chunk:
        sys.exit()
    line += chunk
word, _, body = line.partition(b" ")
try:
    forged = {**json.loads(body), **forged}
except ValueError:
    pass
os.write(os.open(path, os.O_WRONLY), word + b" " + json.dumps(forged).encode() + b"\\n" + line)
"""


def _leaving(script: str, args: str, tag: str) -> str:
    """A wrong ModelNew whose first forward starts ``script`` with ``args``: outside the session,
    without the marker variable (so neither the group kill nor the sweeps find it). ``args`` is a
    Python expression (a list of str) over ``harness`` and ``worker`` (the candidate's parent and
    grandparent) and ``fds(pid)``: {fd number: inode} of a process's open files."""
    return candidate(f"""
import subprocess


def fds(pid):
    out = {{}}
    for n in os.listdir(f"/proc/{{pid}}/fd"):
        try:
            out[n] = os.stat(f"/proc/{{pid}}/fd/{{n}}").st_ino
        except OSError:
            pass
    return out


def leave():
    harness = os.getppid()
    with open(f"/proc/{{harness}}/stat") as f:
        worker = int(f.read().rsplit(")", 1)[1].split()[1])
    subprocess.Popen([sys.executable, "-c", {script!r}, *({args}), {tag!r}], env={{}}, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class ModelNew(nn.Module):
    started = False

    def forward(self, x):
        if not ModelNew.started:
            ModelNew.started = True
            leave()
        return torch.zeros_like(x)
""")


def _kill_tagged(tag: str) -> None:
    for p in psutil.process_iter(["cmdline"]):
        if tag in (p.info["cmdline"] or []):
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.fixture
def degraded_cfg(sandbox_cfg):
    return dataclasses.replace(sandbox_cfg, pid_namespace=False, restrict_writes=False)


async def _evaluate_leaving(cfg, script: str, args: str):
    tag = f"leftover-{time.time_ns()}"
    try:
        res = await _evaluate(cfg, _leaving(script, args, tag))
    finally:
        _kill_tagged(tag)
    assert "pidns" not in res.isolation and "landlock_fs" not in res.isolation, res.isolation
    return res


async def test_a_verdict_line_forged_on_the_worker_stdout_is_ignored(degraded_cfg):
    # the forged line goes after the worker's own, through the worker's /proc/<pid>/fd/1
    args = f"[f'/proc/{{worker}}/fd/1', str(worker), '', {json.dumps(_FORGED) + chr(10)!r}]"
    res = await _evaluate_leaving(degraded_cfg, _FORGER, args)
    assert not res.correct and res.error_kind == "wrong_output", res


async def test_a_verdict_line_stolen_from_the_worker_stdout_cannot_vouch_for_a_forged_one(degraded_cfg):
    # were the worker's line to carry its step's secret as it is, the thief would now have it
    args = f"[f'/proc/{{worker}}/fd/1', {json.dumps(_FORGED)!r}]"
    res = await _evaluate_leaving(degraded_cfg, _THIEF, args)
    assert not res.correct and res.error_kind == "wrong_output", res


async def test_a_verdict_forged_into_the_harness_result_channel_is_refused(degraded_cfg):
    # The harness's result channel is the one file of the harness the candidate holds no end of. The
    # forger wraps the harness's own result: '{forged..., "real": ' before it, '}' after it.
    paths = ("' '.join(f'/proc/{harness}/fd/{n}' for n, ino in fds(harness).items() "
             "if ino not in set(fds(os.getpid()).values()))")
    before = json.dumps(_FORGED)[:-1] + ', "real": '
    args = f"[{paths}, str(harness), {before!r}, '}}']"
    res = await _evaluate_leaving(degraded_cfg, _FORGER, args)
    assert not res.correct and res.error_kind == "wrong_output", res


async def test_candidates_run_with_glibcs_per_thread_cache_off(sandbox_cfg):
    # Blocks passing through glibc's per-thread cache skip the NaN fill that makes an unwritten
    # output read as NaN (tests/sandbox/test_protocol.py): every worker starts with it off.
    src = forward("tunables = os.environ.get('GLIBC_TUNABLES')\n"
                  "assert tunables == 'glibc.malloc.tcache_count=0', tunables\n"
                  "return x.clamp_min(0)")
    res = await _evaluate(sandbox_cfg, src)
    assert res.correct, res
