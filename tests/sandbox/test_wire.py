"""The typed contract between the sandbox's processes (sandbox/wire.py): a step request survives its
JSON line whole, a request with a key nobody declared is refused by name, a runner's reply is held to
its keys, and a runner cannot report a failure of a kind only the trusted side may give."""
from __future__ import annotations

import dataclasses
import json

import pytest

from sandbox.config import load_default_config
from sandbox.launch import StepOutcome
from sandbox.limits import call_limit, maybe_crowded, run_limit
from sandbox.wire import Forged, Isolation, Limits, StepRequest, check_reply, reported_failure


def _request() -> StepRequest:
    return StepRequest(mode="run", backend="cuda", device="cuda:0", workdir="/w", build_dir="/b",
                       limits=Limits(memory_bytes=None, open_files=64, processes=32, cpu_s=60, file_size_bytes=1 << 20),
                       isolation=Isolation(network=True, writes=True, pids=True, drop=["seccomp"], cpus=[3]),
                       correctness_trials=5, seed=7, tolerance={"float32": {"atol": 1e-4, "rtol": 1e-4}}, gated=True)


def test_a_step_request_survives_its_json_line_with_typed_parts():
    req = _request()
    line = req.to_json()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    back = StepRequest.from_json(line)
    assert back == req
    assert isinstance(back.limits, Limits) and isinstance(back.isolation, Isolation)


def test_a_request_with_an_undeclared_key_is_refused_by_name():
    data = json.loads(_request().to_json())
    data["timout_s"] = 3
    with pytest.raises(TypeError, match="timout_s"):
        StepRequest.from_json(json.dumps(data).encode())
    data = json.loads(_request().to_json())
    data["isolation"]["netwrok"] = False
    with pytest.raises(TypeError, match="netwrok"):
        StepRequest.from_json(json.dumps(data).encode())


@pytest.mark.parametrize("msg, op", [
    ({"ok": True, "new_runtime_ms": 0.001}, "call"),
    ({"ok": True, "speedup": 100.0}, "load"),
    ([True], "call"),
    ({"outputs": []}, "call"),
    ({"ok": "yes"}, "ping"),
])
def test_a_reply_outside_its_keys_and_types_is_forged(msg, op):
    with pytest.raises(Forged):
        check_reply(msg, op)


def test_a_runner_cannot_blame_the_sandbox_or_the_reference():
    assert reported_failure({"kind": "sandbox_error", "stage": "judge"}, "correctness")[:2] == \
        ("runtime_error", "correctness")
    assert reported_failure({"kind": "reference_error"}, "timing")[0] == "runtime_error"
    assert reported_failure({"kind": "wrong_output", "stage": "timing", "error": "x" * 9000}, "load") == \
        ("wrong_output", "timing", "x" * 4000)


def test_the_run_limit_grows_with_the_tasks_reference_time():
    cfg = load_default_config(run_timeout_s=60)
    assert run_limit(cfg, None) == 60.0
    fast, slow = run_limit(cfg, 1.0), run_limit(cfg, 1000.0)
    assert 60.0 < fast < 61.0          # a millisecond task: the configured limit, about
    # a task whose forward takes a second gets ten times every call of the step on top
    calls = 2 * cfg.correctness_trials + cfg.warmup_runs + cfg.timing_runs * (1 + 2 * cfg.checked_share) + 2
    assert slow == pytest.approx(60.0 + 10.0 * calls) and slow > 5 * 60.0
    assert run_limit(dataclasses.replace(cfg, timing_runs=2 * cfg.timing_runs), 1000.0) > slow


def test_a_call_of_the_answer_gets_a_limit_only_once_the_reference_time_is_known():
    cfg = load_default_config(call_timeout_floor_s=20.0, call_timeout_ref_factor=1000.0)
    assert call_limit(cfg, None) is None            # unknown: the step's limit alone
    assert call_limit(cfg, 0.5) == 20.0             # a fast task: the floor
    assert call_limit(cfg, 100.0) == pytest.approx(100.0)  # a 100 ms reference: 1000x


def test_a_call_over_its_own_limit_is_not_blamed_on_sharing():
    """A timeout or out of memory while sharing is re-run alone; a call past 1000x the reference
    is the answer's own."""
    assert maybe_crowded(StepOutcome({"error_kind": "timeout", "error": "ran past the run time limit"}))
    assert maybe_crowded(StepOutcome(None, killed_for="timeout"))
    assert maybe_crowded(StepOutcome({"error_kind": "runtime_error", "error": "CUDA out of memory"}))
    assert not maybe_crowded(StepOutcome({"error_kind": "timeout", "flags": ["call_over_limit"]}))
    assert not maybe_crowded(StepOutcome({"error_kind": "wrong_output", "error": "mismatch"}))


def test_cuda_starts_as_a_step_starts_only_without_a_gate(monkeypatch):
    """A gated step starts CUDA on its gate's word (or once admitted), never as it starts."""
    import dataclasses

    from sandbox.wire import Isolation, Limits, StepRequest

    base = StepRequest(mode="run", backend="cuda", device="cuda:0", workdir="/w", build_dir="/b",
                       limits=Limits(memory_bytes=None, open_files=64, processes=32, cpu_s=60, file_size_bytes=1),
                       isolation=Isolation(network=True, writes=True, pids=True))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert base.starts_cuda_early()                                        # no gate: the GPU is the step's
    assert not dataclasses.replace(base, gated=True).starts_cuda_early()
    assert not dataclasses.replace(base, device="cpu").starts_cuda_early()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")                         # no GPU given
    assert not base.starts_cuda_early()
