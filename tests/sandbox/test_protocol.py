"""The protocol's helpers on their own (in-process, no sandbox): poisoned memory, speedup flags,
outputs copied as they are taken. The comparisons are tests/sandbox/test_compare.py."""
import os
import subprocess
import sys
from pathlib import Path

import torch

from sandbox import protocol


_POISON_CHECK = """
import torch
from sandbox import protocol
keep = [torch.randn(1000 * i + 7) for i in range(200)]
del keep[::2]
protocol.prepare_host_allocator()
protocol.poison_memory(4 * 2**20, "cpu")
stale = []
for round in range(100):
    junk = [torch.randn(j % 7 + 1) for j in range(50)]  # small blocks freed between reads
    del junk
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for n in (1, 3, 300, 64 * 1024, 3 * 2**20):
            if not torch.isnan(torch.empty(n, dtype=dtype)).all():
                stale.append((str(dtype), n))
assert protocol.poison_host_allocations(False)
assert not torch.isnan(torch.zeros(8)).any()
print(len(stale), stale[:3])
"""


def test_poisoned_memory_is_what_an_unwritten_output_reads():
    # In a process started as the pool starts its workers (glibc's per-thread cache off): a heap
    # fragmented by earlier work and small blocks freed in between never hand out a stale block.
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}
    out = subprocess.run([sys.executable, "-c", _POISON_CHECK], env=env, capture_output=True, text=True,
                         timeout=120, cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "0", out.stdout


def test_speedups_above_the_bound_are_flagged():
    assert protocol.speedup_flags(50.0, 10.0) == ["excessive_speedup"]
    assert protocol.speedup_flags(2.0, 10.0) == []


def test_outputs_kept_on_the_device_are_copies_too():
    # the harness keeps the reference's outputs on the GPU for the comparison (to_host=False):
    # like the host copies, they must not change when the model writes its buffer again
    buf = torch.zeros(4)

    def model(x):
        buf.copy_(x)
        return buf

    for to_host in (True, False):
        first = protocol.run_once(model, [torch.ones(4)], "cpu", "reference", to_host=to_host)
        model(torch.full((4,), 7.0))
        assert torch.equal(first[0], torch.ones(4)), to_host

