"""A colocated trainer rank holds its share of the GPU from the start (pipeline/trainer/gpu_share.py)."""
import subprocess
import sys

import pytest

from pipeline.trainer.gpu_share import SMALL_POOL_MARGIN, bytes_to_hold

GIB = 2**30


def test_the_share_is_taken_up_to_what_is_free_and_held_only_once():
    assert bytes_to_hold(0.4, 80 * GIB, 70 * GIB, 0) == 32 * GIB - SMALL_POOL_MARGIN
    # other processes hold most of the GPU: only what is free, less the margin
    assert bytes_to_hold(0.4, 80 * GIB, 10 * GIB, 0) == 9 * GIB
    # already held (a second call, or the model built first): nothing more
    assert bytes_to_hold(0.4, 80 * GIB, 40 * GIB, 32 * GIB) == 0
    assert bytes_to_hold(0.4, 80 * GIB, 40 * GIB, 20 * GIB) == 11 * GIB


@pytest.mark.gpu
def test_a_held_share_stays_reserved_and_serves_the_ranks_tensors():
    """In a fresh process: after hold(0.3) the caching allocator holds ~0.3 of the GPU; tensors of a
    few GiB and many small ones come out of it without reserving more."""
    code = r'''
import torch
from pipeline.trainer.gpu_share import hold, SMALL_POOL_MARGIN
dev = torch.device("cuda", 0)
total = torch.cuda.mem_get_info(dev)[1]
n = hold(0.3, dev)
held = torch.cuda.memory_reserved(dev)
assert held >= int(0.3 * total) - SMALL_POOL_MARGIN - (64 << 20), (held, total)
big = [torch.empty(1 << 30, dtype=torch.uint8, device=dev) for _ in range(3)]
small = [torch.empty(1024, device=dev) for _ in range(1000)]
assert torch.cuda.memory_reserved(dev) <= held + SMALL_POOL_MARGIN, (torch.cuda.memory_reserved(dev), held)
print("ok", n, held)
'''
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]
