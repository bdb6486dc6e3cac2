"""``python -m pipeline.warm_start`` builds (or finds) the warm start a run with the same overrides
will use, and its prebuild, without Ray or a trainer; the run then starts at its first batch."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def warm_start(*overrides: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.warm_start", *overrides,
                           f"hydra.run.dir={tmp / 'hydra'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_builds_the_runs_warm_start_and_prebuild(kernel_cache_dir, tmp_path):
    # the laptop learning test's overrides that matter to the key (none of model.*): it finds this one
    shared = [f"model.warm_start_dir={kernel_cache_dir}/warm_start", f"sandbox.cache_dir={kernel_cache_dir}"]
    done = warm_start("+experiment=kernel_multiturn", "profile=laptop", *shared, tmp=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    model = Path(done.stdout.strip().splitlines()[-1])
    assert (model / "config.json").is_file() and model.is_relative_to(Path(kernel_cache_dir) / "warm_start")
    assert "prebuilt.json" in {p.name for p in model.parents[1].iterdir()}
    again = warm_start("+experiment=kernel_multiturn", "profile=laptop", *shared, tmp=tmp_path)
    assert again.returncode == 0 and Path(again.stdout.strip().splitlines()[-1]) == model
    assert "(cached)" in again.stderr


def test_a_run_without_a_warm_start_is_told_so(tmp_path):
    done = warm_start("+experiment=kernel_multiturn", "profile=laptop", "model.warm_start=null", tmp=tmp_path)
    assert done.returncode == 2
    assert "no warm start to build: model.warm_start=None" in done.stderr


def test_model_local_without_a_path_gets_the_projects_message(tmp_path):
    done = warm_start("+experiment=kernel_multiturn", "model=local", tmp=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "model.path is not set" in done.stderr and "Traceback" not in done.stderr
