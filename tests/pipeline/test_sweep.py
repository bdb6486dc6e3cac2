"""``-m`` sweep through the real entry point: two jobs, each its own run dir, Ray up and down per job."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sweep_of_two_jobs(tmp_path):
    env = dict(os.environ, WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "pipeline.main", "-m", "+experiment=toy", "pipeline.steps=1",
           "pipeline.progress=false", "logger=console", "rollout.n_trajectories=4",
           "algorithm.gamma=0.4,0.8", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "laptop profile" in proc.stderr
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in jobs] == ["0", "1"]
    gammas = []
    for job in jobs:
        lines = (job / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 1 and json.loads(lines[0])["step"] == 0
        gammas.append(json.loads((job / "config.json").read_text())["algorithm"]["gamma"])
    assert gammas == [0.4, 0.8]
