"""The judge's comparisons beyond the tolerance check (sandbox/compare.py):
inputs left as they were, and answers a loose tolerance cannot tell from real ones."""
from __future__ import annotations

from typing import Any

import torch

from sandbox import compare


def same(a: torch.Tensor, b: Any) -> bool:
    """Equal values (NaN where NaN) of the same shape and dtype."""
    if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return False


def degenerate(refs: list[torch.Tensor], inputs: list[Any], tolerance: dict[str, Any]) -> list[str]:
    """Which trivial answers (zeros, a constant, the first input) would pass this task's check at
    these tolerances (KernelBench notes that all-zero outputs pass some level-1 problems): where any
    does, the check is too loose for the task, and :func:`relative_floor` applies as well."""
    # one value broadcast, never materialised (a 6 GiB output would need two 6 GiB copies); the
    # comparison stops at the first slice that misses: only pass or fail matters here
    trivial = {"zeros": [_filled(r, 0) for r in refs], "constant": [_filled(r, _typical(r)) for r in refs]}
    first = inputs[0] if inputs else None
    if isinstance(first, torch.Tensor) and len(refs) == 1 and first.shape == refs[0].shape \
            and first.dtype == refs[0].dtype:
        trivial["input"] = [first]
    return [name for name, outs in trivial.items()
            if any(r.numel() for r in refs) and compare.compare_outputs(outs, refs, tolerance, first_miss=True) is None]


def _typical(r: torch.Tensor) -> float | complex:
    """One value an answer could return everywhere: the mean, rounded for integer and bool outputs
    (an integer output's "constant" was once the reference itself, so every such task was flagged)."""
    if not r.numel():
        return 0.0
    if r.is_complex():  # a float64 sum of it would drop the imaginary part
        return complex(_wide_sum(r, torch.complex128)) / r.numel()
    mean = float(_wide_sum(r, torch.float64)) / r.numel()
    return mean if r.is_floating_point() else float(round(mean))


_SUM_CHUNK = 1 << 24  # elements cast at once: a 6 GiB float32 output cast whole needed 12 GiB more (H100, OOM)


def _wide_sum(r: torch.Tensor, dtype: torch.dtype, chunk: int = _SUM_CHUNK) -> float | complex:
    """``r.sum(dtype=dtype)`` in slices: the cast to the wide type is materialised per slice only."""
    flat = r.reshape(-1)
    total = 0j if dtype.is_complex else 0.0
    for start in range(0, flat.numel(), chunk):
        part = flat[start:start + chunk].sum(dtype=dtype)
        total += complex(part) if dtype.is_complex else float(part)
    return total


def _filled(r: torch.Tensor, value: float | complex) -> torch.Tensor:
    """``torch.full_like(r, value)`` as a zero-stride view of one element."""
    return torch.full((), value, dtype=r.dtype, device=r.device).expand(r.shape)


def relative_floor(new: list[torch.Tensor], refs: list[torch.Tensor], tolerance: dict[str, Any],
                   passing: list[str]) -> str | None:
    """The relative error of each floating output as a whole (its norm) must be within the dtype's
    rtol (at least 1e-3): zeros or a constant are off by ~100 % there, an honest kernel by rounding.
    Complex outputs too (their error is the norm of the complex difference)."""
    for i, (n, r) in enumerate(zip(new, refs)):
        if not (r.is_floating_point() or r.is_complex()) or not r.numel():
            continue
        err, scale = compare.error_norms(n, r)
        tol = max(compare.tolerance_for(r.dtype, tolerance)[1], 1e-3)
        if (err > 0.0 if scale == 0.0 else err / scale > tol):
            return (f"output {i}: relative error {err / max(scale, 1e-30):.3g} over {tol:g} (this task's check "
                    f"passes {passing} at its tolerances, so a relative floor applies)")
    return None
