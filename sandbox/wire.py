"""The typed contract between the sandbox's processes: pool -> worker (the step request), worker ->
pool (the tagged verdict line), judge <-> runner (calls and the descriptors of shared tensors).

One module, so that the four places that build a request and the ~30 places that read one agree on
every field by construction (they were a dict built in four places and read through string keys).
Plain data and JSON only: nothing that crosses a process boundary is ever unpickled.
"""
from __future__ import annotations

import dataclasses
import hmac
import json
import os
from dataclasses import dataclass, field
from typing import Any

KEY_BYTES = 32                 # the step's result key (secrets.token_bytes): HMAC-SHA256 key size
MARKER = "SANDBOX_EVAL_ID"     # environment variable that marks every process of one step
MAX_RESULT_BYTES = 4 * 1024 * 1024   # the judge's result the outer process reads at most
MAX_LINE_BYTES = 8 * 1024 * 1024     # the verdict line the pool reads at most
MAX_MESSAGE_BYTES = 1 << 20          # one runner message (descriptors are small)


@dataclass
class Limits:
    memory_bytes: int | None       # RLIMIT_AS (CPU backends); None where CUDA needs the address space
    open_files: int
    processes: int
    cpu_s: int
    file_size_bytes: int


@dataclass
class Isolation:
    network: bool                  # own network namespace + Landlock TCP rules
    writes: bool                   # Landlock (reads and writes) at all
    pids: bool                     # PID + mount namespaces, private /proc
    drop: list[str] = field(default_factory=list)   # measures the trusted GPU probe found to break the device
    shm_bytes: int = 0             # size of the private /dev/shm (0: leave /dev/shm as it is)
    cpus: list[int] = field(default_factory=list)   # the CPU set of the step (empty: leave it)
    dir_bytes: int = 0             # quota of the runners' scratch (their work dirs, the build dir's overlay)
    dir_files: int = 0


@dataclass
class StepRequest:
    """What the pool asks one worker process to do (one JSON line on its stdin)."""

    mode: str                      # "compile" | "run" | "probe"
    backend: str                   # cpu | triton | cuda
    device: str                    # "cpu" or "cuda:0" (the one GPU the step sees)
    workdir: str
    build_dir: str
    limits: Limits
    isolation: Isolation
    cpu_threads: int = 1
    candidate_src: str = ""
    task_src: str = ""
    probe_src: str = ""
    correctness_trials: int = 0    # the configuration's names, on the wire too (sandbox/config.py)
    seed: int = 0
    warmup_runs: int = 0
    timing_runs: int = 0
    timing_budget_s: float = 0.0   # 0: every answer makes warmup + timing runs; else see sandbox/config.py
    timing_input_sets: int = 1
    checked_share: float = 0.2     # share of timed calls whose output is checked (at least one per input set)
    tolerance: dict[str, dict[str, float]] = field(default_factory=dict)
    flush_bytes: int = 0
    poison_bytes: int = 0
    excessive_speedup_threshold: float = 10.0
    ref_runtime_ms: float | None = None   # the pool's known reference time (None: the judge times it)
    call_limit_s: float | None = None     # one call of the candidate, at most (None: the step's limit only)
    # with no call_limit_s, the judge sizes one from a call of the reference it makes first (0: it does not)
    call_timeout_floor_s: float = 0.0
    call_timeout_ref_factor: float = 0.0
    timeout_s: float = 0.0
    timed: bool = False
    timing_probe: bool = False     # extra timed windows reported in wall_s (probe_*_ms), never in the speedup
    pch_root: str | None = None
    narrow_header_dir: str | None = None
    split_root: str | None = None  # trusted parts of the split C++ build (sandbox/split_build.py)
    read_roots: list[str] = field(default_factory=list)  # extra readable dirs (pch, narrow headers)
    output_tail_bytes: int = 8192
    gated: bool = False            # wait for the pool's word before touching the device
    gate_fd: int | None = None     # socket to the pool's device gate (the judge keeps it alone)
    key_fd: int | None = None      # socket holding the result key (the outer process reads it)

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode() + b"\n"

    def starts_cuda_early(self) -> bool:
        """Whether this step's processes start CUDA as they start: a GPU already given
        (CUDA_VISIBLE_DEVICES) and no gate. A gated step starts CUDA when its gate says ``warm``
        (one of the next steps to be admitted: the gate keeps room for their contexts) or, failing
        that, once admitted, inside its reservation."""
        return self.device.startswith("cuda") and bool(os.environ.get("CUDA_VISIBLE_DEVICES")) and not self.gated

    @classmethod
    def from_json(cls, raw: bytes) -> "StepRequest":
        data = json.loads(raw)
        data["limits"] = Limits(**data["limits"])
        data["isolation"] = Isolation(**data["isolation"])
        return cls(**data)


# --- the verdict line ---------------------------------------------------------------------------

def result_tag(key: bytes, body: bytes) -> bytes:
    """HMAC-SHA256 of ``body`` under ``key``, in hex: no space or newline in it."""
    return hmac.new(key, body, "sha256").hexdigest().encode()


def result_line(result: dict[str, Any], key: bytes) -> bytes:
    """``<tag> <json>\\n``: the tag is an HMAC of the JSON under the step's key. Not the key itself:
    whoever can write to the worker's stdout (a reopened /proc/<pid>/fd/1) can read it too, so a
    line that merely carried the key would hand it to the forger."""
    body = json.dumps(result).encode()
    return result_tag(key, body) + b" " + body + b"\n"


def read_result_line(line: bytes, key: bytes) -> dict[str, Any] | None:
    """The result of a line :func:`result_line` made with ``key``; None for any other line."""
    tag, sep, body = line.rstrip(b"\n").partition(b" ")
    if not sep or not hmac.compare_digest(tag, result_tag(key, body)):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


# --- judge <-> runner ---------------------------------------------------------------------------
# The judge sends {"op": ...}; a runner answers each with exactly one reply. Replies are checked
# against these key sets: a reply with any other key, or a message when none was asked for, is a
# forged message (the candidate runner's channel is the candidate's to write).

# ``prep`` readies one call (the allocation poison, the seed) before the judge starts its clock;
# ``call`` is the timed forward alone (nothing the runner does first is on the clock)
OPS = ("load", "inputs", "prep", "call", "ping", "stop")
REPLY_KEYS = {
    "ready": {"ready", "isolation"},
    "load": {"ok", "kind", "error", "stage"},
    "inputs": {"ok", "kind", "error", "stage"},
    "ping": {"ok"},
    "prep": {"ok", "kind", "error", "stage"},
    "warm": {"ok"},
    "call": {"ok", "outputs", "kind", "error", "stage", "peak_bytes", "flag"},
}
# What a runner may report a failure as: kinds its own process can cause. Anything else reads as
# runtime_error (a candidate must not be able to say "sandbox_error" or "reference_error").
RUNNER_KINDS = ("load_error", "compile_error", "runtime_error", "memory_limit", "wrong_output", "rule_violation")
RUNNER_FLAGS = ("output_aliases_input", "output_aliases_output")   # the flags a runner may name for itself
RUNNER_STAGES = ("load", "compile", "correctness", "timing")

# A shared tensor: {"kind": "cuda" | "memfd", "dtype", "shape", "stride", "offset"} plus, for
# "cuda": "handle" (base64 of torch's handle: a kind byte + the cudaIpcMemHandle), "storage_bytes", "storage_offset_bytes",
# "ref_counter" (base64 name of torch's shared ref counter), "ref_counter_offset", "event" (base64
# of the cudaIpcEventHandle or null), "event_sync"; for "memfd": "nbytes", "fd" (its index
# among the message's passed descriptors). A non-tensor input: {"kind": "value", "value": ...}.
DESCRIPTOR_KEYS = {
    "cuda": {"kind", "dtype", "shape", "stride", "offset", "handle", "storage_bytes", "storage_offset_bytes",
             "ref_counter", "ref_counter_offset", "event", "event_sync"},
    "memfd": {"kind", "dtype", "shape", "stride", "offset", "nbytes", "fd"},
    "value": {"kind", "value"},
}
MAX_HANDLE_BYTES = 4096        # a CUDA IPC handle as torch shares it: a kind byte + cudaIpcMemHandle_t (64), or more
MAX_DIMS = 16


class Forged(Exception):
    """A runner sent what the protocol never asks for (unknown keys, types, sizes)."""


def check_reply(msg: Any, op: str) -> dict[str, Any]:
    """``msg`` as a reply to ``op``, or :class:`Forged`."""
    if not isinstance(msg, dict):
        raise Forged(f"a {type(msg).__name__} in reply to {op!r}")
    extra = set(msg) - REPLY_KEYS[op]
    if extra:
        raise Forged(f"unknown keys {sorted(extra)[:5]} in reply to {op!r}")
    if op != "ready" and not isinstance(msg.get("ok"), bool):
        raise Forged(f"reply to {op!r} without a boolean 'ok'")
    return msg


def reported_failure(msg: dict[str, Any], default_stage: str) -> tuple[str, str, str]:
    """(kind, stage, error) of a failure a runner reported, held to what a runner can cause."""
    kind = msg.get("kind")
    stage = msg.get("stage")
    return (kind if kind in RUNNER_KINDS else "runtime_error",
            stage if stage in RUNNER_STAGES else default_stage,
            str(msg.get("error") or "the runner reported a failure")[:4000])
