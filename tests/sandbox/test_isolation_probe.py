"""The isolation probe's step-down, for real on CPU: real workers, real measures, and probes whose
condition really fails while a given measure is in force (CUDA cannot be had here)."""
from __future__ import annotations

import dataclasses
import logging
import os
import socket

import pytest

from sandbox.gpu_probe import DROP_ORDER, IsolationProbe
from sandbox.pool import SandboxPool
from tests.sandbox.conftest import fixture_source

RELU = fixture_source("tasks/relu.py")
ANSWER = fixture_source("answers/relu_python_correct.py")


QUICK = {"correctness_trials": 1, "warmup_runs": 0, "timing_runs": 1}  # the verdict is not the point


def cpu_probe(src: str) -> IsolationProbe:
    return IsolationProbe(src=src, backends=("cpu",), needs_gpu=False)


def test_the_default_probe_gates_gpu_run_steps_only():
    probe = IsolationProbe()
    assert probe.applies("cuda", True) and probe.applies("triton", True)
    assert not probe.applies("triton", False) and not probe.applies("cpu", False)
    assert "torch.cuda.init()" in probe.src


async def test_a_probe_failing_under_the_private_proc_drops_the_pid_namespace_only(sandbox_cfg, caplog):
    # The host's processes are invisible exactly while pidns + private /proc are in force.
    probe = cpu_probe(f"import os\nassert os.path.exists('/proc/{os.getpid()}'), 'host processes hidden'\n")
    with caplog.at_level(logging.WARNING, logger="sandbox.gpu_probe"):
        async with SandboxPool(sandbox_cfg, isolation_probe=probe) as pool:
            first = await pool.evaluate(RELU, ANSWER, "cpu", **QUICK)
            verdict, stats = pool.probe_verdict, pool.stats()
    if "private_proc" not in first.isolation and "pidns" not in first.isolation and verdict.dropped == ():
        pytest.skip("no PID namespace on this machine")
    assert verdict.worked and verdict.dropped == ("pidns",), verdict
    assert "host processes hidden" in verdict.errors[0]
    # the full sandbox, then each measure alone up to the PID namespace
    assert stats["isolation_probe_runs"] == 2 + DROP_ORDER.index("pidns") and stats["isolation_dropped"] == 1
    assert first.correct, first
    assert not {"pidns", "private_proc"} & set(first.isolation)
    assert {"mountns", "netns", "landlock_fs"} <= set(first.isolation), first.isolation
    assert any("go without pidns" in r.getMessage() for r in caplog.records)


async def test_a_probe_failing_in_a_network_namespace_steps_down_to_it_and_keeps_landlock_tcp(sandbox_cfg):
    if len(socket.if_nameindex()) < 2:
        pytest.skip("this machine has only a loopback interface")
    # /proc/net/dev lists the interfaces of the reader's network namespace (if_nameindex() would need
    # a netlink socket, which seccomp refuses on its own)
    probe = cpu_probe("n = open('/proc/net/dev').read().count(':')\nassert n > 1, 'only loopback: a netns'\n")
    async with SandboxPool(sandbox_cfg, isolation_probe=probe) as pool:
        res = await pool.evaluate(RELU, ANSWER, "cpu", **QUICK)
        verdict = pool.probe_verdict
    assert res.correct, res
    if "netns" not in verdict.isolation and not verdict.dropped:
        pytest.skip("no network namespace on this machine")
    assert verdict.worked and "netns" in verdict.dropped and "landlock" not in verdict.dropped, verdict
    assert verdict.dropped == ("netns",), verdict  # the one measure in the way, alone
    assert "netns" not in res.isolation
    assert {"landlock_fs", "landlock_tcp"} <= set(res.isolation), res.isolation  # TCP stays blocked


async def test_a_probe_that_never_works_keeps_full_isolation(sandbox_cfg, caplog):
    probe = cpu_probe("raise RuntimeError('device init failed (stand-in for error 304)')\n")
    with caplog.at_level(logging.ERROR, logger="sandbox.gpu_probe"):
        async with SandboxPool(sandbox_cfg, isolation_probe=probe) as pool:
            res = await pool.evaluate(RELU, ANSWER, "cpu", **QUICK)
            verdict = pool.probe_verdict
    assert not verdict.worked and verdict.dropped == ()
    assert len(verdict.errors) >= 2 and all("stand-in for error 304" in e for e in verdict.errors)
    assert res.correct and "landlock_fs" in res.isolation, res
    assert any("keeping full isolation" in r.getMessage() for r in caplog.records)


async def test_a_candidate_cannot_trigger_the_step_down(sandbox_cfg):
    cand = ANSWER.replace("return x.clamp_min(0.0)", "raise RuntimeError('Unexpected error from "
                          "cudaGetDeviceCount() Error 304: OS call failed')")
    async with SandboxPool(sandbox_cfg, isolation_probe=cpu_probe("pass\n")) as pool:
        bad = await pool.evaluate(RELU, cand, "cpu", **QUICK)
        assert pool.probe_verdict.dropped == () and pool.stats()["isolation_probe_runs"] == 1
    assert bad.error_kind == "runtime_error" and "Error 304" in bad.error, bad
    assert {"pidns", "private_proc", "landlock_fs"} <= set(bad.isolation), bad.isolation


async def test_the_switch_turns_the_probe_off(sandbox_cfg):
    off = dataclasses.replace(sandbox_cfg, gpu_isolation_probe=False)
    async with SandboxPool(off, isolation_probe=cpu_probe("raise RuntimeError('never run')\n")) as pool:
        res = await pool.evaluate(RELU, ANSWER, "cpu", **QUICK)
        assert pool.probe_verdict is None and "isolation_probe_runs" not in pool.stats()
    assert res.correct and {"pidns", "private_proc", "landlock_fs"} <= set(res.isolation), res


async def test_a_probe_failing_only_under_landlock_keeps_the_namespaces(sandbox_cfg):
    # The H200's case (2026-12-03): only Landlock was in the way. Leaving out one measure at a time
    # finds that, so the PID, mount and network namespaces stay.
    probe = cpu_probe("import os, tempfile\nfd, path = tempfile.mkstemp(dir='/tmp')\nos.close(fd)\nos.remove(path)\n")
    async with SandboxPool(sandbox_cfg, isolation_probe=probe) as pool:
        res = await pool.evaluate(RELU, ANSWER, "cpu", **QUICK)
        verdict = pool.probe_verdict
    if verdict.dropped == () and "landlock_fs" not in verdict.isolation:
        pytest.skip("no Landlock on this machine")
    assert verdict.worked and verdict.dropped == ("landlock",), verdict
    assert res.correct, res
    assert "landlock_fs" not in res.isolation
    assert {"pidns", "mountns", "netns"} <= set(res.isolation), res.isolation
    assert DROP_ORDER[-1] == "landlock"  # so: the full sandbox, then each measure alone, Landlock last
    assert pool.stats()["isolation_probe_runs"] == 1 + len(DROP_ORDER), pool.stats()
