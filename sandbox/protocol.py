"""The evaluation protocol, one function per step (KernelBench-eval style).

These functions run inside a sandbox worker process (sandbox/worker.py decides which process runs
which step). Clocks are captured when this module is imported, which the worker does before any
candidate code is loaded: a candidate that replaces ``time.perf_counter`` or ``torch.cuda.Event``
changes nothing here.
"""
from __future__ import annotations

import ctypes
import importlib.util
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
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


def clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


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


# --- correctness --------------------------------------------------------------------------------

@dataclass
class Mismatch:
    which_output: int | None
    message: str
    max_abs_err: float | None = None
    max_rel_err: float | None = None


def tolerance_for(dtype: torch.dtype, tolerance: dict[str, Any]) -> tuple[float, float]:
    if not dtype.is_floating_point and not dtype.is_complex:
        return 0.0, 0.0
    name = str(dtype).removeprefix("torch.")
    tol = tolerance.get(name, tolerance["float32"])
    return float(tol["atol"]), float(tol["rtol"])


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype comparisons of ``dtype`` are done in: float32 holds float16, bfloat16 and float32
    exactly, and its rounding of a difference (2**-24 of it) is far inside any tolerance of those
    dtypes; complex outputs stay complex (complex128: a real dtype would drop the imaginary part,
    so an answer wrong only there would pass); float64, integers and the rest keep float64."""
    if dtype.is_complex:
        return torch.complex128
    return torch.float32 if dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.float64


SLICE_ELEMENTS = {"cpu": 1 << 20, "gpu": 1 << 25}  # elements per slice of a comparison


def _slices(n: torch.Tensor, r: torch.Tensor) -> tuple[int, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    """(how many slices, slice i of both tensors): flattened, in :func:`_wide` of their dtype, made
    when asked for (a float16 output widened whole would double its memory). 1M elements on the
    host keeps every temporary in cache and off fresh mmaps (a whole 8192x4096 output took ~10 s a
    trial on one core); on a GPU the slices are larger and the work is the device's. A candidate
    that is one value broadcast (zero strides: the judge's own trivial answers, never a runner's
    output, which is cloned dense) stays one value, a zero-stride view of each slice's length: a 0-d
    value broadcast by the slice's ops broke torch 2.11's ``isclose(equal_nan=True)``, whose NaN mask
    is an in-place AND into the first argument's shape (every judge on the H200 failed, 2026-12-05)."""
    size = SLICE_ELEMENTS["cpu" if n.device.type == "cpu" else "gpu"]
    wide = _wide(r.dtype)
    scalar = n.dim() > 0 and not any(n.stride())
    nflat = n.as_strided((), ()).to(wide) if scalar else n.reshape(-1)
    rflat = r.reshape(-1)

    def part(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = i * size, (i + 1) * size
        rf = rflat[lo:hi].to(wide)
        return (nflat.expand(rf.shape) if scalar else nflat[lo:hi].to(wide)), rf

    return -(-rflat.numel() // size), part


def _fast_stats(nf: torch.Tensor, rf: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """[values within tolerance, max abs error, max rel error] of one slice, in about a third of
    the exact path's passes over memory: it assumes every value is finite. ``d <= |r| * rtol + atol``
    is ``torch.isclose``'s own test, computed the same way; where every value passes it and the
    largest difference is finite (:func:`_settled`), neither side has a NaN or Inf and these
    figures are exactly the exact path's. Any other slice is computed again by :func:`_exact_stats`."""
    d = (nf - rf).abs()  # out of place: a complex difference's modulus is real
    rabs = rf.abs()
    close = (d <= rabs * rtol + atol).sum()
    worst = d.max()
    rel = d.div_(rabs.clamp_min_(1e-12)).max()
    return torch.stack([close.double(), worst.double(), rel.double()])


def _settled(close: float, worst: float, size: int) -> bool:
    """Whether a slice's fast figures are its exact ones: every value within tolerance and the
    largest difference finite (``isclose`` refuses an infinite difference even where the allowed
    error is infinite too, next to an infinite reference; a NaN difference makes the max NaN)."""
    return close == size and math.isfinite(worst)


def _exact_stats(nf: torch.Tensor, rf: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """[NaN/Inf where the reference is finite, max abs error, max rel error, values not close] of one
    slice, NaN and Inf included (a position where both sides are NaN or infinite is no error)."""
    finite_n, finite_r = torch.isfinite(nf), torch.isfinite(rf)
    diff = (nf - rf).abs()
    diff.masked_fill_(~(finite_n | finite_r), 0.0)  # both NaN or infinite: no error
    diff.nan_to_num_(nan=math.inf)                   # one side NaN: an infinite error
    # a NaN reference where the candidate is NaN too was zeroed above; elsewhere it is inf
    rel = diff / rf.abs().nan_to_num_(nan=1.0).clamp_min_(1e-12)
    return torch.stack([(finite_r & ~finite_n).sum().double(), diff.max().double(), rel.max().double(),
                        (~torch.isclose(nf, rf, atol=atol, rtol=rtol, equal_nan=True)).sum().double()])


def _output_stats(n: torch.Tensor, r: torch.Tensor, atol: float, rtol: float,
                  first_miss: bool) -> tuple[int, float, float, int]:
    """(NaN/Inf where the reference is finite, max abs error, max rel error, values not close) of
    one output. Every slice takes the fast path; the slices it cannot settle are computed exactly.
    The fast results stay on the device and are read once (on a GPU each read is a synchronise,
    and a 6 GiB output is ~50 slices); with ``first_miss`` each slice is read as it is done and
    the first slice with a miss ends the comparison (the errors are then of the slices so far)."""
    count, part = _slices(n, r)
    if first_miss:
        bad_new = not_close = 0
        worst_abs = worst_rel = 0.0
        for i in range(count):
            nf, rf = part(i)
            close, a, rel = _fast_stats(nf, rf, atol, rtol).tolist()
            if not _settled(close, a, rf.numel()):
                b, a, rel, nc = _exact_stats(nf, rf, atol, rtol).tolist()
                bad_new, not_close = bad_new + int(b), not_close + int(nc)
            worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, rel)
            if bad_new or not_close:
                break
        return bad_new, worst_abs, worst_rel, not_close
    sizes, fast = [], []
    for i in range(count):
        nf, rf = part(i)
        sizes.append(rf.numel())
        fast.append(_fast_stats(nf, rf, atol, rtol))
    rows = [[0.0, a, rel, 0.0] if _settled(close, a, size) else _exact_stats(*part(i), atol, rtol).tolist()
            for i, ((close, a, rel), size) in enumerate(zip(torch.stack(fast).tolist(), sizes))]
    return (int(sum(x[0] for x in rows)), max(x[1] for x in rows), max(x[2] for x in rows),
            int(sum(x[3] for x in rows)))


def error_norms(n: torch.Tensor, r: torch.Tensor) -> tuple[float, float]:
    """(||n - r||, ||r||) in float64, a slice at a time (a whole 6 GiB float32 output in float64
    would take three 12 GiB copies)."""
    count, part = _slices(n, r)
    err2 = torch.zeros((), dtype=torch.float64, device=r.device)
    ref2 = torch.zeros((), dtype=torch.float64, device=r.device)
    for i in range(count):
        nf, rf = part(i)
        if not rf.is_complex():
            nf, rf = nf.double(), rf.double()
        err2 += (nf - rf).abs().square_().sum()  # the modulus: a complex output's error is complex
        ref2 += rf.abs().square_().sum()
    e, f = torch.stack([err2, ref2]).sqrt_().tolist()
    return e, f


def compare_outputs(new: list[torch.Tensor], ref: list[torch.Tensor], tolerance: dict[str, Any],
                    first_miss: bool = False) -> Mismatch | None:
    """None when every output matches; otherwise the first wrong output and how it is wrong
    (``first_miss``: stop at the first slice with a miss, for a pass/fail answer alone)."""
    return compare_with_errors(new, ref, tolerance, first_miss)[0]


def compare_with_errors(new: list[torch.Tensor], ref: list[torch.Tensor], tolerance: dict[str, Any],
                        first_miss: bool = False) -> tuple[Mismatch | None, float, float]:
    """:func:`compare_outputs` and, in the same pass (a passing trial's record, computed while
    the GPU is held), the largest absolute and relative error over every output compared. A
    position where both sides are NaN or infinite counts as no error."""
    if len(new) != len(ref):
        return Mismatch(None, f"candidate returned {len(new)} outputs, the reference {len(ref)}"), 0.0, 0.0
    worst_abs = worst_rel = 0.0
    for i, (n, r) in enumerate(zip(new, ref)):
        if tuple(n.shape) != tuple(r.shape):
            return Mismatch(i, f"output {i}: shape {tuple(n.shape)}, expected {tuple(r.shape)}"), worst_abs, worst_rel
        if n.dtype != r.dtype:
            return Mismatch(i, f"output {i}: dtype {n.dtype}, expected {r.dtype}"), worst_abs, worst_rel
        if n.numel() == 0:
            continue
        atol, rtol = tolerance_for(r.dtype, tolerance)
        bad_new, abs_err, rel_err, not_close = _output_stats(n, r, atol, rtol, first_miss)
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        if bad_new:
            return Mismatch(i, f"output {i}: {bad_new} NaN/Inf values where the reference is finite",
                            abs_err, rel_err), worst_abs, worst_rel
        if not_close:
            return Mismatch(i, f"output {i}: max abs error {abs_err:.3g}, max rel error {rel_err:.3g} "
                               f"(atol {atol:g}, rtol {rtol:g})", abs_err, rel_err), worst_abs, worst_rel
    return None, worst_abs, worst_rel


# --- timing -------------------------------------------------------------------------------------

def median_ms(times: Sequence[float]) -> float:
    return float(statistics.median(times))


def speedup_flags(speedup: float | None, bound: float) -> list[str]:
    return ["excessive_speedup"] if speedup is not None and speedup > bound else []
