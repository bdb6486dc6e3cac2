"""The judge of the second protocol against answers that try its seams (real workers, CPU backend,
pure-Python answers: no compiles). Each must end with no credit and the reason named; the pool then
serves a correct answer as before (tests/sandbox/test_adversarial.py shows that part for the rest)."""
from __future__ import annotations

import json
import textwrap

import pytest

from sandbox.pool import SandboxPool
from tests.sandbox.conftest import fixture_source

RELU = fixture_source("tasks/relu.py")
CORRECT = fixture_source("answers/relu_python_correct.py")
HEADER = "import os, sys, time, struct, socket, ctypes\nimport torch\nimport torch.nn as nn\n"


def forward(code: str, init: str = "", prelude: str = "") -> str:
    return (HEADER + CHANNEL + textwrap.dedent(prelude) + "\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n" + textwrap.indent(textwrap.dedent(init) or "pass", " " * 8) + "\n"
            "    def forward(self, x):\n" + textwrap.indent(textwrap.dedent(code), " " * 8) + "\n")


# Answer code: _send(msg, fds) writes ``msg`` as a framed message on the answer's channel to the
# judge (the one socket it holds), passing the descriptors ``fds``.
CHANNEL = textwrap.dedent("""
    import json as _json


    def _channel():
        for n in sorted(os.listdir('/proc/self/fd'), key=int):
            try:
                if int(n) > 2 and os.readlink(f'/proc/self/fd/{n}').startswith('socket:'):
                    return socket.socket(fileno=os.dup(int(n)))
            except OSError:
                continue


    def _send(msg, fds=()):
        body = _json.dumps(msg).encode()
        socket.send_fds(_channel(), [struct.pack('<I', len(body)) + body], list(fds))


    def _input_fd():
        return next(int(n) for n in os.listdir('/proc/self/fd')
                    if os.readlink(f'/proc/self/fd/{n}').startswith('/memfd:sandbox-input'))
    """)


def channel_send(msg: dict, fds_expr: str = "[]") -> str:
    return f"_send({msg!r}, {fds_expr})\n"


async def _evaluate(cfg, src, **kw):
    async with SandboxPool(cfg) as pool:
        res = await pool.evaluate(RELU, src, "cpu", **kw)
        again = await pool.evaluate(RELU, CORRECT, "cpu")
    assert again.correct, again  # the hostile answer changed nothing for the next one
    return res


async def test_a_timing_sent_by_the_answer_is_a_forged_message(sandbox_cfg):
    # the old protocol believed times the candidate's process sent; now any message with keys no
    # reply has is forged, and scores nothing
    src = forward("return x.clamp_min(0)", prelude=channel_send({"ok": True, "times": [1e-6] * 5}))
    res = await _evaluate(sandbox_cfg, src)
    assert not res.correct and res.error_kind == "rule_violation", res
    assert "forged_message" in res.flags, res


async def test_a_reply_written_before_it_was_asked_for_is_forged(sandbox_cfg):
    # a well-formed reply queued ahead of a call would read as an instant answer
    src = forward("return x.clamp_min(0)", init=channel_send({"ok": True}))
    res = await _evaluate(sandbox_cfg, src)
    assert not res.correct and res.error_kind == "rule_violation" and "forged_message" in res.flags, res


async def test_a_failure_forged_by_the_answer_stays_its_own(sandbox_cfg):
    forged = {"ok": False, "kind": "sandbox_error", "stage": "done", "error": "forged failure"}
    src = forward(channel_send(forged) + "os._exit(0)\n")
    res = await _evaluate(sandbox_cfg, src)
    assert not res.correct and res.error_kind == "runtime_error", res
    assert res.stage == "correctness" and res.error == "forged failure", res


async def test_an_output_handed_back_as_the_inputs_own_buffer_is_aliasing(sandbox_cfg):
    # a forged reply that describes the judge's input buffer (the memfd the runner mapped) as its output
    src = forward(textwrap.dedent("""
        desc = {"kind": "memfd", "dtype": "float32", "shape": list(x.shape), "stride": list(x.stride()),
                "offset": 0, "nbytes": x.numel() * 4, "fd": 0}
        _send({"ok": True, "outputs": [desc]}, [_input_fd()])
        os._exit(0)"""))
    res = await _evaluate(sandbox_cfg, src)
    assert not res.correct and res.error_kind == "rule_violation", res
    assert "output_aliases_input" in res.flags, res


async def test_writing_an_input_in_place_gets_nothing(sandbox_cfg):
    # the judge's input buffers are mapped read-only in the runner and sealed against new writable maps
    res = await _evaluate(sandbox_cfg, forward("return x.clamp_min_(0)"))
    assert not res.correct and res.error_kind == "runtime_error", res
    reopened = forward(textwrap.dedent("""
        import mmap
        mmap.mmap(os.open(f'/proc/self/fd/{_input_fd()}', os.O_RDWR), 4, mmap.MAP_SHARED, mmap.PROT_WRITE)
        return x.clamp_min(0)"""))
    res = await _evaluate(sandbox_cfg, reopened)
    assert not res.correct and res.error_kind == "runtime_error" and "PermissionError" in (res.error or ""), res


async def test_work_skipped_after_the_correctness_trials_is_a_stale_output(sandbox_cfg):
    # honest while checked for correctness, then the last output again: a timed call's output is
    # checked against the reference on the same (fresh) inputs
    trials = sandbox_cfg.correctness_trials
    src = forward(f"self.n += 1\nif self.n <= {trials}:\n    self.last = x.clamp_min(0)\nreturn self.last",
                  init="self.n = 0\nself.last = None")
    res = await _evaluate(sandbox_cfg, src)
    assert not res.correct and res.error_kind == "rule_violation" and "stale_output" in res.flags, res


async def test_an_output_cache_keyed_on_a_few_input_values_earns_no_speedup(sandbox_cfg):
    # every timed call sees values never seen before, so a cache never hits: timed like honest work
    src = forward("k = tuple(x.flatten()[:4].tolist())\n"
                  "if k not in self.c:\n    time.sleep(0.02)\n    self.c[k] = x.clamp_min(0)\nreturn self.c[k]",
                  init="self.c = {}")
    res = await _evaluate(sandbox_cfg, src)
    assert res.correct and res.timed, res
    assert res.new_runtime_ms >= 20.0, res  # the sleep of every miss is in every timed call


async def test_the_time_that_counts_is_the_judges_own(sandbox_cfg):
    # an answer that slows itself and replaces every clock in its process: the judge's clock sees it
    src = forward("time.sleep(0.03)\nreturn x.clamp_min(0)",
                  prelude="time.perf_counter = lambda: 0.0\ntime.monotonic = lambda: 0.0\n"
                          "torch.cuda.Event = None\n")
    res = await _evaluate(sandbox_cfg, src)
    assert res.correct and res.timed and res.new_runtime_ms >= 30.0, res
    assert res.speedup is not None and res.speedup < 1.0, res


@pytest.mark.parametrize("bad", [{"ok": True, "outputs": [{"kind": "memfd", "dtype": "float32", "shape": [2**40],
                                                            "stride": [1], "offset": 0, "nbytes": 4, "fd": 0}]},
                                 {"ok": True, "outputs": [{"kind": "pickle", "data": "gASV"}]},
                                 {"ok": True, "outputs": "not a list"}])
async def test_malformed_output_descriptors_are_forged(bad, sandbox_cfg):
    src = forward("f = os.memfd_create('x')\nos.ftruncate(f, 4)\n" + channel_send(bad, "[f]") + "os._exit(0)\n")
    res = await _evaluate(sandbox_cfg, src)
    assert not res.correct and res.error_kind == "rule_violation" and "forged_message" in res.flags, res


async def test_a_host_that_cannot_confine_says_so_in_one_line(sandbox_cfg, caplog):
    import dataclasses
    import logging

    cfg = dataclasses.replace(sandbox_cfg, restrict_writes=False, pid_namespace=False)
    with caplog.at_level(logging.WARNING, logger="sandbox.pool"):
        async with SandboxPool(cfg) as pool:
            for _ in range(2):
                res = await pool.evaluate(RELU, CORRECT, "cpu")
                assert res.correct, res
    lines = [r.getMessage() for r in caplog.records if "runs answers without" in r.getMessage()]
    assert len(lines) == 1 and "landlock_read" in lines[0] and "pidns" in lines[0], lines


def test_a_judge_failure_names_the_sandbox_frame_that_raised():
    """A judge's own failure (sandbox_error) says where in sandbox/ it raised, ahead of the
    exception's text (results cut long errors, and a CUDA error's text is long)."""
    from sandbox import share, worker

    try:
        share.overlaps(None, ("a", 0, 1))  # type: ignore[arg-type]  # any function of sandbox/ that raises
    except TypeError as exc:
        where = worker._where(exc)
    assert where.startswith(" at share.py:") and where.endswith("(overlaps)")
    assert worker._where(ValueError("raised outside the sandbox")) == ""
