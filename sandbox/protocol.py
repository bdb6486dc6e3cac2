"""The evaluation protocol, one function per step (KernelBench-eval style).

These functions run inside a sandbox worker process (sandbox/worker.py decides which process runs
which step). Clocks are captured when this module is imported, which the worker does before any
candidate code is loaded: a candidate that replaces ``time.perf_counter`` or ``torch.cuda.Event``
changes nothing here.
"""
from __future__ import annotations

import ctypes
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

import torch

_perf_counter = time.perf_counter
_CudaEvent = torch.cuda.Event
_cuda_synchronize = torch.cuda.synchronize
_manual_seed = torch.manual_seed
_no_grad = torch.no_grad


class StepError(Exception):
    """A protocol step failed; ``kind`` is one of sandbox.result.ERROR_KINDS."""

    def __init__(self, kind: str, message: str, stage: str):
        super().__init__(message)
        self.kind, self.message, self.stage = kind, message, stage


# --- load / build -------------------------------------------------------------------------------

def load_module(source: str, name: str, directory: str | Path) -> ModuleType:
    """Import ``source`` as module ``name`` from its own file in ``directory`` (tracebacks show lines)."""
    path = Path(directory) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _is_build_failure(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    # "disallowed build argument": sandbox.flags refused a flag before anything was built
    markers = ("Error building extension", "ninja: build stopped", "CalledProcessError",
               "CompilationError", "nvcc", "error: ", "disallowed build argument")
    return any(m in text for m in markers)


def build_candidate(source: str, directory: str | Path, name: str = "candidate") -> ModuleType:
    """Load the candidate; ``load_inline`` calls at import time compile here. Needs ``ModelNew``."""
    try:
        compile(source, f"{name}.py", "exec")
    except SyntaxError as exc:
        raise StepError("load_error", f"SyntaxError: {exc}", "load") from exc
    try:
        module = load_module(source, name, directory)
    except MemoryError as exc:
        raise StepError("memory_limit", "MemoryError while loading the candidate", "compile") from exc
    except BaseException as exc:  # noqa: BLE001 - SystemExit from untrusted code is a verdict too
        kind = "compile_error" if _is_build_failure(exc) else "load_error"
        raise StepError(kind, describe_exception(exc), "compile" if kind == "compile_error" else "load") from exc
    if not isinstance(getattr(module, "ModelNew", None), type):
        raise StepError("load_error", "the candidate defines no class ModelNew", "load")
    return module


def load_task(source: str, directory: str | Path) -> ModuleType:
    """Load the reference; a task without Model/get_inputs/get_init_inputs is the task's fault."""
    try:
        module = load_module(source, "reference_task", directory)
    except BaseException as exc:  # noqa: BLE001
        raise StepError("reference_error", f"task source failed to load: {describe_exception(exc)}", "load") from exc
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise StepError("reference_error", f"task source defines no {attr}", "load")
    return module


def memory_or_runtime(exc: BaseException) -> str:
    """The kind of a failure raised by model code: out of memory, or any other runtime error."""
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text \
            or "outofmemory" in text or "cannot allocate memory" in text:
        return "memory_limit"
    return "runtime_error"


def describe_exception(exc: BaseException, limit: int = 2000) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit // 2] + "\n...\n" + text[-limit // 2:]


# --- inputs, models, poisoning ------------------------------------------------------------------

def seed_everything(seed: int) -> None:
    random.seed(seed)
    _manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:
        pass


def to_device(x: Any, device: str) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(to_device(v, device) for v in x)
    return x


def make_inputs(task: ModuleType, seed: int, device: str) -> list[Any]:
    """Trial inputs drawn from ``seed`` on ``device`` itself: ``get_inputs()`` runs with it as torch's
    default device, so a 6 GiB input of a KernelBench task never exists on the host. The same seed on
    the same device gives the same values (the judge redraws them to check for tampering)."""
    seed_everything(seed)
    with torch.device(device):
        values = task.get_inputs()
    return [to_device(x, device) for x in values]


def make_model(cls: type, task: ModuleType, seed: int, device: str) -> torch.nn.Module:
    """Same seed before both constructors, so Model and ModelNew draw the same parameters (on the
    device itself: a large weight is never made on the host first)."""
    seed_everything(seed)
    with torch.device(device):
        init = [to_device(x, device) for x in task.get_init_inputs()]
        model = cls(*init)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
    return model


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_PERTURB = -1, -3, -6
# glibc fills each malloc'd block with (value ^ 0xff) & 0xff: 0x100 gives 0xff bytes, a NaN in every float
# dtype (and -1 in ints), while the value stays nonzero, which is what switches perturbing on.
_PERTURB_TO_NAN = 0x100


def prepare_host_allocator() -> None:
    """Keep freed host blocks in the heap (glibc) rather than handing them back to the kernel."""
    _mallopt(_M_MMAP_THRESHOLD, 32 * 1024 * 1024)
    _mallopt(_M_TRIM_THRESHOLD, 1 << 30)


def poison_host_allocations(enabled: bool) -> bool:
    """While on, every host allocation (``torch.empty`` on CPU included) starts as NaN bytes.

    Deterministic, unlike filling and freeing a buffer and hoping the allocator hands it back: a heap
    already fragmented by earlier work serves small requests from stale blocks. Only with glibc's
    per-thread cache off (``GLIBC_TUNABLES=glibc.malloc.tcache_count=0``, set by the pool for every
    worker): blocks that pass through that cache skip the fill. Turned off for timing,
    where the fill would be charged to the candidate alone. Returns whether glibc took the setting.
    """
    return _mallopt(_M_PERTURB, _PERTURB_TO_NAN if enabled else 0)


def _mallopt(param: int, value: int) -> bool:
    try:
        return bool(ctypes.CDLL(None).mallopt(param, value))
    except (OSError, AttributeError):  # not glibc: the NaN fill of poison_memory is all there is
        return False


def poison_memory(nbytes: int, device: str) -> None:
    """Fill and free ``nbytes`` with NaN: an output left unwritten reads as NaN, not as a stale answer.

    On the host, :func:`poison_host_allocations` is what makes this hold; the fill is only for an
    allocator that does not take it (not glibc).
    """
    if nbytes <= 0 or (device == "cpu" and poison_host_allocations(True)):
        return
    for chunk in _chunks(nbytes, 16 * 1024 * 1024 if device == "cpu" else nbytes):
        buf = torch.empty(max(chunk // 4, 1), dtype=torch.float32, device=device)
        buf.fill_(float("nan"))
        del buf
    if device.startswith("cuda"):
        _cuda_synchronize()


def _chunks(total: int, size: int) -> list[int]:
    return [min(size, total - i) for i in range(0, total, size)]


def start_cuda(device: str) -> None:
    """Start CUDA on ``device`` (its context and a first block), where it is a GPU: the judge and
    the runners do this before any answer is imported, so that the held window need not. A failure
    is left to what follows (the load starts CUDA again and reports it)."""
    if not device.startswith("cuda"):
        return
    try:
        torch.empty(1, device=device)
    except Exception:  # noqa: BLE001 - reported by the next use of the device
        pass


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        _cuda_synchronize()  # the whole device: work the candidate queued on side streams included


def outputs_as_list(out: Any, who: str) -> list[torch.Tensor]:
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    for i, item in enumerate(items):
        if not isinstance(item, torch.Tensor):
            raise StepError("wrong_output", f"{who} output {i} is a {type(item).__name__}, expected a tensor",
                            "correctness")
    return items


def run_once(model: Callable, inputs: Sequence[Any], device: str, who: str,
             to_host: bool = True) -> list[torch.Tensor]:
    """Forward, wait for the device, and copy the outputs at once (later writes cannot change them);
    the copies stay on the device with ``to_host=False``."""
    with _no_grad():
        out = model(*inputs)
        synchronize(device)
        outs = outputs_as_list(out, who)
        copied = [t.detach().to("cpu", copy=True) if to_host else t.detach().clone() for t in outs]
        synchronize(device)
    return copied


# --- timing -------------------------------------------------------------------------------------

def median_ms(times: Sequence[float]) -> float:
    return float(statistics.median(times))


def speedup_flags(speedup: float | None, bound: float) -> list[str]:
    return ["excessive_speedup"] if speedup is not None and speedup > bound else []
