"""The judge's comparison of a candidate's outputs with the reference's (docs/sandbox.md, "One run
step"): shape, dtype, NaN/Inf, per-dtype atol/rtol, the largest absolute and relative errors, on
the device in slices of a wide dtype. The judge runs it; no answer code is in its process."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch


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
    d = nf - rf
    d = d.abs() if d.is_complex() else d.abs_()  # a complex difference's modulus is real: a new tensor
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
        diff = nf - rf
        if diff.is_complex():  # the modulus: a complex output's error is complex
            diff, rf = diff.abs(), rf.abs()
        err2 += diff.square_().sum()
        ref2 += rf.square().sum()
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
