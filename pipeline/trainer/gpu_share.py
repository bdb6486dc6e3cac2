"""A trainer rank's share of a GPU it shares with a vLLM engine and kernel evaluations
(``resources.trainer.gpu_memory_fraction`` where the pools are colocated): capped, and held from
the start.

torch's cap (``set_per_process_memory_fraction``) only stops this process from taking more; it
reserves nothing. The engine takes its share when it starts, but the trainer grows into its own at
its first step, by which time kernel evaluations may hold the rest of the GPU: on an H100 (2026-12-07)
a trainer with 14.4 of its 31.7 allowed GiB in use ran out of memory beside ~40 GB of one
evaluation's processes. An answer that allocates more than its admission (untrusted code) could do
the same. So the rank takes its share into torch's caching allocator at once, as one block it
frees again: the allocator keeps the segment and splits it for the model, the optimiser and the
activations (this module's ``hold`` never calls ``empty_cache``, nor does the trainer). A margin
stays free for the allocator's small-block pool (new 2 MiB segments under the cap), so that its first
small allocation does not make it release the whole block.
"""
from __future__ import annotations

import torch

SMALL_POOL_MARGIN = 1 << 30  # bytes of the share left to the allocator's small-block segments


def bytes_to_hold(fraction: float, total: int, free: int, reserved: int, margin: int = SMALL_POOL_MARGIN) -> int:
    """Bytes to take now so that this process holds ``fraction`` of the GPU's ``total`` less
    ``margin``: no more than is ``free`` on the device (less the margin: other processes' and the
    driver's allocations), nothing where it already holds that much."""
    want = int(fraction * total) - reserved - margin
    return max(0, min(want, free - margin))


def hold(fraction: float, device: torch.device) -> int:
    """Cap this process at ``fraction`` of ``device``'s memory and take that share into the caching
    allocator now; the bytes taken."""
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    free, total = torch.cuda.mem_get_info(device)
    n = bytes_to_hold(fraction, total, free, torch.cuda.memory_reserved(device))
    if n > 0:
        block = torch.empty(n, dtype=torch.uint8, device=device)
        del block  # back to the allocator's cache, still reserved from the driver
    return n
