"""The worker's verdict line: tagged with the step's key, which no candidate can read.

The pool takes the first line whose tag is right; sandbox.worker's outer process alone holds the
key (the forgeries themselves are in test_adversarial.py).
"""
from __future__ import annotations

import json
import os
import textwrap

from sandbox import launch as launch_module
from sandbox.pool import SandboxPool
from sandbox.worker import read_result_line, result_line, result_tag
from tests.sandbox.conftest import fixture_source

RELU = fixture_source("tasks/relu.py")
CORRECT = fixture_source("answers/relu_python_correct.py")
KEY = os.urandom(32)
RESULT = {"stage": "done", "correct": True, "speedup": 1.5, "wall_s": {"worker_total": 1.0}, "log_tail": "ok\n"}


def test_a_line_tagged_with_the_key_reads_back_as_its_result():
    line = result_line(RESULT, KEY)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert read_result_line(line, KEY) == RESULT
    assert read_result_line(line.rstrip(b"\n"), KEY) == RESULT
    assert KEY not in line and KEY.hex().encode() not in line  # the line never carries the key


def test_lines_without_the_right_tag_are_refused():
    line = result_line(RESULT, KEY)
    tag, _, body = line.partition(b" ")
    forged = json.dumps({**RESULT, "speedup": 1000.0}).encode()
    assert read_result_line(result_line(RESULT, os.urandom(32)), KEY) is None  # another step's key
    assert read_result_line(tag + b" " + forged + b"\n", KEY) is None          # a stolen tag, a new body
    assert read_result_line(body, KEY) is None                                  # the old untagged format
    assert read_result_line(b'{"ready": true}\n', KEY) is None
    assert read_result_line(b"x" + line, KEY) is None                           # bytes written before it
    for junk in (b"", b"\n", b" ", b"garbage", KEY.hex().encode() + b" " + body, b"\xff\xfe \xff"):
        assert read_result_line(junk, KEY) is None, junk
    listed = json.dumps([RESULT]).encode()
    assert read_result_line(result_tag(KEY, listed) + b" " + listed, KEY) is None  # tagged, but not an object


async def test_a_worker_without_a_tagged_line_is_lost_as_one_that_wrote_nothing(sandbox_cfg, monkeypatch):
    # every line refused: the step is run again, then it is a sandbox error, as before for no line
    monkeypatch.setattr(launch_module, "read_result_line", lambda line, key: None)
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, CORRECT, "cpu")
        assert pool.stats()["lost_workers"] == sandbox_cfg.lost_worker_retries + 1
    assert not res.correct and res.error_kind == "sandbox_error", res
    assert "lost twice" in res.error and "untagged line(s) ignored" in res.error, res.error


async def test_the_key_is_nowhere_the_candidate_can_read(sandbox_cfg, monkeypatch):
    # The candidate looks for the key (raw or hex) in its environment, argv, open files, work dir
    # and its whole writable memory (which it was forked with: the harness's, and the outer
    # process's as it was when it forked the harness). Its source holds the two halves apart, and
    # its search never joins them, so only a copy it did not make can be found.
    monkeypatch.setattr(launch_module, "new_step_key", lambda: KEY)
    src = _SEEKER.format(a=KEY[:16].hex(), b=KEY[16:].hex())
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu")
    assert res.correct, res.error


_SEEKER = textwrap.dedent('''
    import os
    import torch
    import torch.nn as nn

    A, B = bytes.fromhex("{a}"), bytes.fromhex("{b}")
    PAIRS = ((A, B), (A.hex().encode(), B.hex().encode()))


    def holds(data):
        for first, second in PAIRS:
            i = data.find(first)
            while i >= 0:
                if data[i + len(first):i + len(first) + len(second)] == second:
                    return True
                i = data.find(first, i + 1)
        return False


    def read(path, limit=1 << 24):
        try:
            with open(path, "rb") as f:
                return f.read(limit)
        except OSError:
            return b""


    def memory_holds():
        fd = os.open("/proc/self/mem", os.O_RDONLY)
        try:
            for line in read("/proc/self/maps").decode().splitlines():
                span, perms = line.split()[:2]
                if not perms.startswith("rw"):
                    continue
                lo, hi = (int(x, 16) for x in span.split("-"))
                at = lo
                while at < hi:
                    step = min(1 << 24, hi - at)
                    try:
                        data = os.pread(fd, min(step + 128, hi - at), at)  # overlapping: no key is split
                    except OSError:
                        break
                    if holds(data):
                        return True
                    at += step
        finally:
            os.close(fd)
        return False


    def where():
        if holds(read("/proc/self/environ")) or holds(read("/proc/self/cmdline")):
            return "environment or argv"
        for n in os.listdir("/proc/self/fd"):
            try:
                link = os.readlink(f"/proc/self/fd/{{n}}")
            except OSError:
                continue
            if link.startswith("socket:"):
                import socket
                try:
                    sock = socket.socket(fileno=os.dup(int(n)))
                    sock.setblocking(False)
                    data = sock.recv(1 << 16, socket.MSG_PEEK)
                    sock.detach()
                except OSError:
                    data = b""
                if holds(data):
                    return f"fd {{n}} ({{link}})"
                continue
            if os.path.isfile(link) and holds(read(link)):
                return f"fd {{n}} ({{link}})"
        for root, _, files in os.walk(os.getcwd()):
            for name in files:
                if holds(read(os.path.join(root, name))):
                    return os.path.join(root, name)
        if memory_holds():
            return "memory"
        return None


    class ModelNew(nn.Module):
        checked = False

        def forward(self, x):
            if not ModelNew.checked:
                ModelNew.checked = True
                found = where()
                if found:
                    raise RuntimeError(f"the key is readable: {{found}}")
            return x.clamp_min(0)
''')


def test_the_outer_process_sees_the_judge_exit_at_once_not_at_its_next_poll():
    """The judge closes its pipes before its exit status can be read (its CUDA context and PID
    namespace still being torn down): the outer process wakes on the judge's pidfd, where it polled
    every 0.2 s, a wait that sat inside every step's GPU window."""
    import time

    from sandbox.worker import _pump

    log_r, log_w = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the judge: its verdict, its pipes closed, then 30 ms of teardown before it exits
        os.close(log_r)
        os.close(res_r)
        os.write(res_w, b'{"stage": "done"}')
        os.close(res_w)
        os.close(log_w)
        time.sleep(0.03)
        os._exit(0)
    os.close(log_w)
    os.close(res_w)
    t = time.monotonic()
    _, raw, status = _pump(log_r, res_r, pid, 1024)
    took = time.monotonic() - t
    os.close(log_r)
    os.close(res_r)
    assert json.loads(raw) == {"stage": "done"} and os.WIFEXITED(status)
    assert took < 0.15, f"the judge's exit seen {took:.3f} s after its pipes closed"
