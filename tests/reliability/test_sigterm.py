"""SIGTERM to the driver (preemption): the step under way finishes, a checkpoint is written even
though checkpoint.every would not have, the process exits; resume=auto continues at the next step
with nothing lost or repeated. The real entry point, real Ray, tiny Qwen2, FSDP2 on gloo, ToyEnv."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["+experiment=toy", "logger=console", "pipeline.progress=false", "pipeline.mode=one_off",
        "pipeline.steps=5", "checkpoint.every=0", "checkpoint.at_end=false", "checkpoint.keep_last=0",
        "resources.ray.num_cpus=8"]


def steps_logged(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()]


def driver(run_dir: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "pipeline.main", *ARGS, f"hydra.run.dir={run_dir}", *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_continues(tmp_path):
    proc = driver(tmp_path)
    try:
        deadline = time.monotonic() + 300
        while not steps_logged(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert steps_logged(tmp_path), proc.communicate(timeout=30)[0][-3000:]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    done = steps_logged(tmp_path)
    assert "stop requested" in out and proc.returncode == 0, out[-3000:]
    last = done[-1]
    assert done == list(range(last + 1)) and last < 4, (done, out[-2000:])
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == [f"step_{last:06d}"], ckpts  # every=0: only the SIGTERM wrote one

    resumed = driver(tmp_path, "resume=auto")
    out2, _ = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, out2[-3000:]
    assert f"at step {last + 1}" in out2
    assert steps_logged(tmp_path) == list(range(5))  # nothing lost, nothing twice
