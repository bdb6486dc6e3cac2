"""Isolation between evaluations: a hostile answer is evaluated, then a clean one in the same pool;
the clean one's verdict must be what it is on its own. Plus reading secrets, writing outside,
network and leftover processes by routes tests/sandbox does not take. Real worker processes,
pure-Python candidates (no compiles)."""
from __future__ import annotations

import dataclasses
import os
import textwrap
import time
import uuid

import psutil
import pytest

from sandbox.pool import SandboxPool
from tests.sandbox.conftest import fixture_source

RELU = fixture_source("tasks/relu.py")
CORRECT = fixture_source("answers/relu_python_correct.py")
HEADER = "import os, sys, time, glob, signal, socket, subprocess\nimport torch\nimport torch.nn as nn\n"


def forward(code: str, init: str = "pass", prelude: str = "") -> str:
    return (HEADER + textwrap.dedent(prelude) + "\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n" + textwrap.indent(textwrap.dedent(init), " " * 8) + "\n"
            "    def forward(self, x):\n" + textwrap.indent(textwrap.dedent(code), " " * 8) + "\n")


def _cache_paths_write(kind: str) -> str:
    # every file the pool keeps across evaluations, found from the candidate's own environment
    return f"""
    root = os.environ.get('TORCH_EXTENSIONS_DIR', '')
    for up in range(4):
        root = os.path.dirname(root)
        for p in glob.glob(os.path.join(root, '**', '*.json'), recursive=True):
            try:
                open(p, 'w').write({kind!r})
            except OSError:
                pass
    """


# hostile answer -> (what it must get, substring of its error or None). After it, CORRECT must pass
# with a speedup in the same range as on a fresh pool.
CONTAMINATION = {
    "env_var_for_later_runs": (forward("return x.clamp_min(0)", prelude="""
        os.environ['OMP_NUM_THREADS'] = '64'
        os.environ['PYTHONPATH'] = '/dev/shm/evil'
        os.makedirs('/dev/shm/evil', exist_ok=True)
        open('/dev/shm/evil/torch.py', 'w').write('raise SystemExit(0)')
        open('/dev/shm/evil/sitecustomize.py', 'w').write('import torch; torch.relu = lambda t: t * 0')
        """), "correct", None),
    "overwrites_cached_reference_time": (forward("return x.clamp_min(0)", prelude=_cache_paths_write(
        '{"ref_runtime_ms": 1e9, "compiled": true}')), "correct", None),
    "plants_files_in_its_build_dir_for_the_next_candidate": (forward("return x.clamp_min(0)", prelude="""
        d = os.environ['TORCH_EXTENSIONS_DIR']
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, 'relu_python_correct.py'), 'w').write('raise SystemExit(0)')
        open(os.path.join(os.path.dirname(d), 'candidate.py'), 'w').write('raise SystemExit(0)')
        """), "load_error", "Permission"),
    "patches_torch_on_disk": (forward("return x.clamp_min(0)", prelude="""
        import torch.nn.functional as F
        open(F.__file__, 'a').write('\\nrelu = lambda t, inplace=False: t * 0\\n')
        """), "load_error", "Permission"),
    "writes_poisoned_shm_tensors": (forward("return x.clamp_min(0)", prelude="""
        for i in range(8):
            torch.save(torch.zeros(128, 512), f'/dev/shm/torch_{i}.pt')
        """), "correct", None),
    "daemon_that_kills_later_workers": (forward("return x.clamp_min(0)", prelude="""
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                end = time.time() + 20
                while time.time() < end:
                    for p in os.listdir('/proc'):
                        if p.isdigit() and int(p) != os.getpid():
                            try:
                                os.kill(int(p), signal.SIGKILL)
                            except OSError:
                                pass
                    time.sleep(0.01)
            os._exit(0)
        """), "timeout|runtime_error", None),  # it kills its own candidate process first
    # pid 1 of the namespace ignores signals from inside it; the harness goes on
    # refused where Landlock scopes signals (the candidate has its own domain); else the harness
    # must survive being stopped
    "signals_its_harness": (forward("try:\n    os.kill(os.getppid(), signal.SIGSTOP)\nexcept PermissionError:\n"
                                    "    pass\nreturn x.clamp_min(0)"), "correct", None),
    "lowers_priority_and_limits_for_later": (forward("return x.clamp_min(0)", prelude="""
        import resource
        os.nice(19)
        resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
        """), "correct", None),
}


@pytest.mark.parametrize("name", sorted(CONTAMINATION))
async def test_hostile_answer_leaves_the_next_evaluation_unaffected(name, sandbox_cfg):
    src, expected, needle = CONTAMINATION[name]
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu", run_timeout_s=6.0)
        if expected == "correct":
            assert res.correct, res
        else:
            assert not res.correct and res.error_kind in expected.split("|"), res
            if needle:
                assert needle in (res.error or ""), res
        after = await pool.evaluate(RELU, CORRECT, "cpu")
    assert after.correct and after.timed, after
    # the cached reference time was not planted: a correct copy of the reference is ~1x, not 1e9x
    assert after.ref_runtime_ms < 1e3 and after.speedup < 20, after


SECRET_SNOOPS = {
    "reads_the_pool_process_cmdline_and_environ": """
        for pid in (os.getppid(), 1):
            for f in ('environ', 'cmdline'):
                try:
                    seen.append(open(f'/proc/{pid}/{f}', 'rb').read())
                except OSError:
                    pass
        """,
    "walks_every_process_environ_via_the_host_proc": """
        for env in glob.glob('/proc/[0-9]*/task/*/environ'):
            try:
                seen.append(open(env, 'rb').read())
            except OSError:
                pass
        """,
    "reads_wandb_and_hf_files_in_home": """
        for p in ('~/.netrc', '~/.cache/huggingface/token', '~/.config/wandb/settings', '~/.huggingface/token'):
            try:
                seen.append(open(os.path.expanduser(p), 'rb').read())
            except OSError:
                pass
        seen.append(os.environ.get('HOME', '').encode())
        """,
}


@pytest.mark.parametrize("name", sorted(SECRET_SNOOPS))
async def test_driver_secrets_are_not_readable(name, sandbox_cfg, monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_API_KEY", "fake-secret-wandb")
    monkeypatch.setenv("HF_TOKEN", "fake-secret-hf")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".netrc").write_text("machine api.wandb.ai password fake-secret-netrc\n")
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "token").write_text("fake-secret-hf-file")
    src = forward("seen = []\n" + textwrap.dedent(SECRET_SNOOPS[name]) +
                  "hits = [s[:80] for s in seen if b'fake-secret' in s or "
                  f"{str(tmp_path).encode()!r} in s]\n"
                  "if hits:\n    raise RuntimeError(f'saw: {hits}')\nreturn x.clamp_min(0)")
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu")
    assert res.correct, res


WRITES = {
    "home_of_the_driver": "'{home}/planted'",  # the sandbox's own HOME is its work dir
    "tmp_outside_its_dir": "'/tmp/planted-' + str(os.getpid())",
    "the_project_tree": "os.path.join(os.environ['PYTHONPATH'].split(':')[0], 'sandbox', 'planted.py')",
}


@pytest.mark.parametrize("name", sorted(WRITES))
async def test_writes_outside_its_temp_dir_are_refused(name, sandbox_cfg, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    src = forward(f"p = {WRITES[name].format(home=tmp_path)}\nopen(p, 'w').write('x')\nprint('WROTE', p)\nreturn x.clamp_min(0)")
    before = {p for p in os.listdir("/tmp") if p.startswith("planted-")}
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu")
    assert res.error_kind == "runtime_error" and "Permission" in (res.error or ""), res
    assert not (tmp_path / "planted").exists()
    assert {p for p in os.listdir("/tmp") if p.startswith("planted-")} == before
    assert not os.path.exists(os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "sandbox",
                                           "planted.py"))


NETWORK = {
    "udp_dns_query": "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                     "s.settimeout(1)\ns.sendto(b'x', ('8.8.8.8', 53))\ns.recvfrom(10)",
    "resolve_a_host_name": "socket.getaddrinfo('example.com', 443)",
    "ipv6_loopback_listener": "s = socket.socket(socket.AF_INET6)\ns.settimeout(1)\ns.connect(('::1', 22))",
}


@pytest.mark.parametrize("name", sorted(NETWORK))
async def test_other_network_routes_fail(name, sandbox_cfg):
    src = forward(NETWORK[name] + "\nreturn x.clamp_min(0)")
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu")
    assert res.error_kind == "runtime_error" and not res.correct, res


def _timing_phase_leftover(marker: str) -> str:
    # spawned only during timing (after the correctness calls), so only the reference timing
    # that follows can meet it
    return forward(f"""
        self.calls += 1
        if self.calls == {3 + 2}:
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execvp('sleep', ['sleep', '{marker}'])
                os._exit(0)
        return x.clamp_min(0)""", init="self.calls = 0")


def _reference_that_sees(marker: str) -> str:
    # a trusted task that fails when anything of the candidate still runs beside its timing
    return RELU.replace("        return torch.relu(x)", textwrap.indent(textwrap.dedent(f"""
        import os
        for p in os.listdir('/proc'):
            try:
                if p.isdigit() and b'{marker}' in open(f'/proc/{{p}}/cmdline', 'rb').read():
                    raise RuntimeError('a leftover of the candidate runs beside the reference')
            except OSError:
                pass
        return torch.relu(x)"""), " " * 8))


@pytest.mark.parametrize("pid_namespace", [True, False], ids=["pidns", "no-pidns"])
async def test_leftovers_are_gone_before_the_reference_is_timed(sandbox_cfg, pid_namespace):
    """A busy loop left behind would slow the reference, inflate the speedup and poison the
    reference time cached for later evaluations of the task."""
    sandbox_cfg = dataclasses.replace(sandbox_cfg, pid_namespace=pid_namespace, warmup_runs=1, timing_runs=5)
    marker = f"{time.time_ns() % 10**9}.{uuid.uuid4().int % 1000}"
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(_reference_that_sees(marker), _timing_phase_leftover(marker), "cpu")
    assert res.correct and res.timed and res.error_kind is None, res
    time.sleep(0.3)
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
