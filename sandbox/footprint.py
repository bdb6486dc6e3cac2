"""A task's device footprint, measured on the meta device (no memory, no time), and whether it can
fit a GPU at all.

A run step holds, at least, one input buffer and the check set's (the same bytes twice), both
models' parameters and the two runners' outputs; KernelBench's level 1 has inputs of up to 17 GB.
A task whose bare minimum exceeds the device gets one clear error when the tasks are loaded, naming
the task and the bytes, rather than an out-of-memory verdict on every answer. Task sources are the
user's own files (trusted), so they run here, under ``torch.device("meta")``.
"""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
import types
from typing import Any


@dataclasses.dataclass(frozen=True)
class Footprint:
    input_bytes: int        # get_inputs() on the meta device
    param_bytes: int        # Model's parameters and buffers
    output_bytes: int | None  # Model's forward on the meta device; None where an op has no meta kernel

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


def measure(source: str, name: str = "task") -> Footprint:
    """The footprint of a task source (``Model``, ``get_inputs``, ``get_init_inputs``)."""
    import torch

    mod = types.ModuleType(f"footprint_{abs(hash(name))}")
    exec(compile(source, name, "exec"), mod.__dict__)  # noqa: S102 - the user's own task file
    with torch.device("meta"):
        inputs = mod.get_inputs()
        model = mod.Model(*mod.get_init_inputs())
        params = nbytes([*model.parameters(), *model.buffers()]) if isinstance(model, torch.nn.Module) else 0
        try:
            with torch.no_grad():
                out: int | None = nbytes(model(*inputs))
        except Exception:  # noqa: BLE001 - an op without a meta kernel: the outputs stay unknown
            out = None
    return Footprint(nbytes(inputs), params, out)


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


def step_estimate(fp: Footprint, input_sets: int, flush_bytes: int, poison_bytes: int, context_bytes: int) -> int:
    """Device memory one run step may hold at once, from the meta-device footprint (before any step
    of the task has measured its peaks): the judge's input buffers, check set and fresh draw, its
    copy of an output and its cache flush buffer; each runner's parameters and up to three outputs'
    worth of results and intermediates; the NaN poison the candidate frees before a call; a CUDA
    context per process. Generous on purpose: an estimate too small is caught only when a step
    runs out of memory (and is then run again alone)."""
    inputs, outputs = fp.input_bytes, fp.output_bytes or 0
    poison = max(poison_bytes, min(2 * inputs, 8 << 30))  # as sandbox/run_step.py poisons
    judge = inputs * (input_sets + 2) + outputs + flush_bytes
    runners = 2 * (fp.param_bytes + 3 * outputs) + poison
    return judge + runners + 3 * context_bytes
