"""resume=auto continues a checkpoint only under the config it was written with; resume=force
continues anyway; a missing model.path is a message, not a traceback. All before Ray starts."""
import json
import pickle
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from pipeline import checkpoint
from pipeline.config import ConfigError
from pipeline.main import run
from tests.pipeline.test_e2e import CONF, config

TOY = ["+experiment=toy", "logger=console", "pipeline.progress=false"]


def fake_run_dir(tmp_path, *overrides):
    """A run dir as an earlier run leaves it: config.json and one checkpoint."""
    cfg = config(*TOY, *overrides)
    OmegaConf.resolve(cfg)
    (tmp_path / "config.json").write_text(json.dumps(OmegaConf.to_container(cfg), default=str))
    step = tmp_path / "checkpoints" / "step_000000"
    step.mkdir(parents=True)
    (step / "loop.pt").write_bytes(pickle.dumps({"step": 0}))
    return tmp_path


def test_config_diff_lists_leaves_and_skips_what_may_differ():
    saved = {"algorithm": {"gamma": 0.4, "clip": 0.2}, "pipeline": {"steps": 10}, "logger": {"mode": "auto"}}
    new = {"algorithm": {"gamma": 0.8, "clip": 0.2}, "pipeline": {"steps": 20}, "logger": {"mode": "online"},
           "extra": 1}
    assert checkpoint.config_diff(saved, new) == ["algorithm.gamma: 0.4 -> 0.8", "extra: '<absent>' -> 1"]


def test_auto_refuses_a_changed_config_naming_the_keys(tmp_path):
    run_dir = fake_run_dir(tmp_path, "algorithm.gamma=0.4")
    with pytest.raises(checkpoint.ResumeMismatch) as err:
        run(config(*TOY, "algorithm.gamma=0.8", "trainer.optim.lr=0.5"), run_dir)
    msg = str(err.value)
    assert "algorithm.gamma: 0.4 -> 0.8" in msg and "trainer.optim.lr" in msg
    assert "resume=never" in msg and "resume=force" in msg and "name=" in msg
    # what may differ between a run and its continuation does not count
    assert checkpoint.check_resume_config("auto", run_dir, json.loads(
        json.dumps(OmegaConf.to_container(config(*TOY, "algorithm.gamma=0.4", "pipeline.steps=99"),
                                          resolve=True), default=str))) == []


def test_force_continues_listing_the_differences(tmp_path):
    run_dir = fake_run_dir(tmp_path, "algorithm.gamma=0.4")
    new = OmegaConf.to_container(config(*TOY, "algorithm.gamma=0.8"), resolve=True)
    assert checkpoint.check_resume_config("force", run_dir, new) == ["algorithm.gamma: 0.4 -> 0.8"]
    assert checkpoint.resolve_resume("force", run_dir / "checkpoints") == run_dir / "checkpoints" / "step_000000"
    # never and an explicit checkpoint path are not compared
    assert checkpoint.check_resume_config("never", run_dir, new) == []


def test_unknown_resume_value_is_named():
    from pipeline.config import check

    with pytest.raises(ConfigError, match="resume='sometimes'"):
        check(config(*TOY, "resume=sometimes"))


def test_model_local_without_a_path_is_one_message(tmp_path):
    with pytest.raises(ConfigError, match="model.path is not set"):
        run(config(*TOY, "model=local"), tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pipeline.main", *TOY, "model=local",
                           f"hydra.run.dir={tmp_path}"], cwd=CONF.parent, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "model.path is not set" in proc.stderr
    assert "Traceback" not in proc.stderr
