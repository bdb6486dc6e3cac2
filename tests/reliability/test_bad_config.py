"""Bad input at start: a wrong key, a wrong type or an impossible value stops the run before Ray
or any model starts, with a message that names the key and says what was expected."""
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.config import check, register

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def config(*overrides: str):
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("override, named", [
    ("rollout.turnz=2", "rollout.turnz"),          # key no schema declares
    ("pipeline.steps=many", "pipeline.steps"),     # wrong type
    ("algorithm.gamma=[1,2]", "algorithm.gamma"),  # a list where a float goes
])
def test_unknown_keys_and_wrong_types_fail_at_composition(override, named):
    with pytest.raises(Exception) as err:
        config("+experiment=toy", override)
    assert named in str(err.value)


@pytest.mark.parametrize("overrides, named", [
    (["+sandbox.timout=3"], "sandbox.timout: no such key"),  # Hydra's + adds it; check refuses
    (["+zzz=1"], "zzz: no such key"),
    (["rollout.turns=0"], "rollout.turns=0: expected >= 1"),
    (["pipeline.max_trainer_restarts=-1"], "pipeline.max_trainer_restarts=-1: expected >= 0"),
    (["algorithm.clip_ratio_low=0.3", "algorithm.clip_ratio_high=0.2"], "algorithm.clip_ratio_high=0.2 <"),
    (["algorithm.gamma=1.5"], "algorithm.gamma=1.5"),
    (["algorithm.aggregate=mean"], "algorithm.aggregate='mean'"),
    (["algorithm.loss_agg_mode=per-token"], "algorithm.loss_agg_mode"),
    (["model=local", "model.path=/nonexistent/qwen"], "model.path='/nonexistent/qwen' is not a directory"),
    (["reward.backend=fortran"], "reward.backend='fortran'"),
    (["reward.tasks=/no/such/kernelbench"], "reward.tasks='/no/such/kernelbench'"),
    (["resources.sampler.gpus=64", "resources.trainer.gpus=64"], "resources.sampler.gpus=64"),
    (["resources.sampler.gpus=3", "resources.sampler.gpus_per_worker=2"], "gpus_per_worker=2"),
    (["pipeline.mode=async"], "pipeline.mode='async'"),
    (["trainer.optim.lr=0"], "trainer.optim.lr=0"),
])
def test_impossible_values_are_named_by_check(overrides, named):
    cfg = config("+experiment=kernel_multiturn", *overrides)
    with pytest.raises(ValueError) as err:
        check(cfg)
    assert named in str(err.value)


def test_every_bad_key_is_reported_at_once():
    cfg = config("+experiment=kernel_multiturn", "rollout.turns=0", "algorithm.gamma=0",
                 "reward.backend=fortran")
    with pytest.raises(ValueError) as err:
        check(cfg)
    msg = str(err.value)
    assert all(k in msg for k in ("rollout.turns", "algorithm.gamma", "reward.backend")), msg


def test_good_configs_pass_check():
    for exp in ("toy", "kernel_multiturn", "kernel_singleturn"):
        check(config(f"+experiment={exp}"))


def test_entry_point_exits_at_once_naming_the_key(tmp_path):
    """The real command line: non-zero exit, the key in stderr, and no Ray start (seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.main", "+experiment=toy", "rollout.turns=0",
         "algorithm.clip_ratio_high=0.1", f"hydra.run.dir={tmp_path}", "logger=console"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "rollout.turns=0" in proc.stderr and "algorithm.clip_ratio_high=0.1" in proc.stderr
    assert "ray" not in proc.stderr.lower().replace("array", "")  # failed before Ray was started
    assert elapsed < 60, elapsed
