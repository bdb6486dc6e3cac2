"""A task's device footprint, measured on the meta device (no memory, no time), and whether it can
fit a GPU at all.

A run step holds, at least, one input buffer and the check set's (the same bytes twice), both
models' parameters and the two runners' outputs; KernelBench's level 1 has inputs of up to 17 GB.
A task whose bare minimum exceeds the device gets one clear error when the tasks are loaded, naming
the task and the bytes, rather than an out-of-memory verdict on every answer. Task sources are the
user's own files (trusted), so they run here, under ``torch.device("meta")``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import subprocess
import types
from typing import Any


@dataclasses.dataclass(frozen=True)
class Footprint:
    input_bytes: int        # get_inputs() on the meta device
    param_bytes: int        # Model's parameters and buffers
    output_bytes: int | None  # Model's forward on the meta device; None where an op has no meta kernel
    peak_bytes: int | None = None  # the most bytes the forward's own tensors (outputs included) hold at once

    @property
    def minimum_bytes(self) -> int:
        """What one run step holds on its device at the least (docs/sandbox.md, "GPU memory")."""
        return 2 * self.input_bytes + 2 * self.param_bytes + 2 * (self.output_bytes or 0)


def nbytes(x: Any) -> int:
    import torch

    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(nbytes(v) for v in x)
    return 0


BIG_INPUTS = 4 << 30  # inputs above this get one timing buffer instead of timing_input_sets


@functools.lru_cache(maxsize=1024)
def measure(source: str, name: str = "task") -> Footprint:
    """The footprint of a task source (``Model``, ``get_inputs``, ``get_init_inputs``); the same
    source is measured once a process (a run's driver checks its tasks, then loads them again)."""
    import torch

    mod = types.ModuleType(f"footprint_{abs(hash(name))}")
    exec(compile(source, name, "exec"), mod.__dict__)  # noqa: S102 - the user's own task file
    with torch.device("meta"):
        inputs = mod.get_inputs()
        model = mod.Model(*mod.get_init_inputs())
        params = nbytes([*model.parameters(), *model.buffers()]) if isinstance(model, torch.nn.Module) else 0
        external = [*inputs, *model.parameters(), *model.buffers()] if isinstance(model, torch.nn.Module) else inputs
        out: int | None = None
        peak: int | None = None
        for track in (True, False):  # the peak is a refinement: a forward the mode trips still gives outputs
            tracker = _LivePeak(external) if track else contextlib.nullcontext()
            try:
                with torch.no_grad(), tracker:
                    result = model(*inputs)
                out = nbytes(result)
                del result
                peak = tracker.peak if track else None
                break
            except Exception:  # noqa: BLE001 - an op without a meta kernel: the outputs stay unknown
                continue
    return Footprint(nbytes(inputs), params, out, peak)


class _LivePeak:
    """The peak of the bytes a forward's own tensors hold at once, on the meta device: every storage
    an op returns (not an input's or a parameter's) counts from its creation until the last tensor
    on it is gone. Written here because torch's memory tools (``torch.cuda.max_memory_allocated``,
    the profiler) need a real device; a dispatch mode sees every op on meta. Workspaces inside a
    kernel are not seen (the estimate adds one output's worth for them)."""

    def __new__(cls, external: list[Any]) -> Any:
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        import torch

        class Mode(TorchDispatchMode):
            def __init__(self) -> None:
                super().__init__()
                self.outside = {_storage_id(t) for t in tree_leaves(external) if isinstance(t, torch.Tensor)}
                self.refs: dict[int, list[int]] = {}   # storage -> [tensors alive on it, bytes]
                self.live = self.peak = 0

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        self._track(t)
                return out

            def _track(self, t: Any) -> None:
                key = _storage_id(t)
                if key in self.outside:
                    return
                entry = self.refs.get(key)
                if entry is None:
                    entry = self.refs[key] = [0, t.untyped_storage().nbytes()]
                    self.live += entry[1]
                    self.peak = max(self.peak, self.live)
                entry[0] += 1
                weakref.finalize(t, self._gone, key)

            def _gone(self, key: int) -> None:
                entry = self.refs.get(key)
                if entry is None:
                    return
                entry[0] -= 1
                if entry[0] <= 0:
                    self.live -= entry[1]
                    del self.refs[key]

        return Mode()


def _storage_id(t: Any) -> int:
    return t.untyped_storage()._cdata


def device_memory_bytes() -> list[int]:
    """Total memory of each visible GPU (nvidia-smi), [] without one."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [int(float(v)) * 2**20 for v in out.split() if v.replace(".", "").isdigit()]


def too_big(fp: Footprint, memory: int) -> str | None:
    """Why a task cannot fit a device of ``memory`` bytes, or None."""
    if fp.minimum_bytes <= memory:
        return None
    return (f"needs at least {fp.minimum_bytes / 2**30:.1f} GiB on the device (inputs {fp.input_bytes / 2**30:.1f} "
            f"GiB twice, parameters {fp.param_bytes / 2**30:.1f} GiB twice, outputs "
            f"{(fp.output_bytes or 0) / 2**30:.1f} GiB twice), the GPU has {memory / 2**30:.1f} GiB")


def admission_fields(fp: Footprint, timing_input_sets: int) -> dict[str, int] | None:
    """What a GPU run step's judge sends the pool with its ``ready`` (``sandbox.devices.estimate``
    turns it into the bytes the step is admitted on); None: no estimate, the step is admitted alone.
    Inputs over ``BIG_INPUTS`` get one timing buffer, as the judge draws them."""
    if fp.output_bytes is None:
        return None
    sets = 1 if fp.input_bytes > BIG_INPUTS else int(timing_input_sets)
    return {"input_bytes": fp.input_bytes, "param_bytes": fp.param_bytes, "output_bytes": fp.output_bytes,
            "peak_bytes": fp.peak_bytes, "input_sets": sets}


def step_estimate(fp: Footprint, input_sets: int, flush_bytes: int, poison_bytes: int, context_bytes: int) -> int:
    """Device memory one run step may hold at once, from the meta-device footprint (before any step
    of the task has measured its peaks): the judge's input buffers, check set and fresh draw, its
    copy of an output and its cache flush buffer; each runner's parameters, the forward's peak of
    live tensors (``peak_bytes``; outputs included) and one output's worth more for what a kernel
    allocates inside (workspaces, the allocator's rounding); the NaN poison the candidate frees
    before a call, which its caching allocator then hands to that call's tensors (counted once, as
    the larger of the two); a CUDA context per process. Without a measured peak, three outputs'
    worth per runner and the poison on top, as before the peak was measured. An estimate too small
    is caught only when a step runs out of memory (and is then run again alone)."""
    inputs, outputs = fp.input_bytes, fp.output_bytes or 0
    poison = max(poison_bytes, min(2 * inputs, 8 << 30))  # as sandbox/run_step.py poisons
    judge = inputs * (input_sets + 2) + outputs + flush_bytes
    if fp.peak_bytes is None:
        runners = 2 * (fp.param_bytes + 3 * outputs) + poison
    else:
        forward = max(fp.peak_bytes, outputs) + outputs
        runners = 2 * fp.param_bytes + max(poison, forward) + forward
    return judge + runners + 3 * context_bytes
