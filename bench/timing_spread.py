"""How noisy the timing is: the same honest answer evaluated again and again, one pool, one line
of speedups (``python -m bench.timing_spread --repeats 8``). Run it once per checkout (set
PYTHONPATH to the other checkout) and alternate, to compare two protocols side by side."""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile

TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(384, 384), torch.randn(384, 384)]


def get_init_inputs():
    return []
'''
ANSWER = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n" \
         "        return a @ b\n"


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--backend", default="cpu")
    a = ap.parse_args(argv)
    from sandbox.config import load_default_config
    from sandbox.pool import SandboxPool

    speedups, new_ms = [], []
    with tempfile.TemporaryDirectory() as cache:
        cfg = load_default_config(cache_dir=cache, backend=a.backend, max_concurrent=1)
        async with SandboxPool(cfg) as pool:
            for i in range(a.repeats):
                # the task text changes each time (a comment), so the reference is timed every time too
                res = await pool.evaluate(TASK + f"\n# {i}\n", ANSWER, a.backend)
                if res.speedup:
                    speedups.append(res.speedup)
                    new_ms.append(res.new_runtime_ms)
    q = statistics.quantiles(speedups, n=4) if len(speedups) > 1 else [0, 0, 0]
    print(json.dumps({"speedups": [round(s, 3) for s in speedups], "median": statistics.median(speedups),
                      "iqr_over_median": (q[2] - q[0]) / statistics.median(speedups),
                      "new_ms_median": statistics.median(new_ms)}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
