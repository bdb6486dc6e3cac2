"""What a new user does on day one: evaluate a run without touching its files, sweep
twice, Ctrl-C, an own model on a CPU box, W&B's environment variables, and every config or
dependency error before Ray starts, in the one ``[pipeline] invalid configuration`` block."""
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.config import ConfigError, preflight, register

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
SMALL = ["logger=console", "pipeline.progress=false", "rollout.n_trajectories=2",
         "resources.ray.num_cpus=8"]


def compose_cfg(*overrides: str, name: str = "config", hydra: bool = False):
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides), return_hydra_config=hydra)


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No W&B credentials (HOME without a netrc), offline Hub, the checkout importable from any cwd."""
    e = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE", "NETRC")}
    e.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
             TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    e.update(extra)
    return {k: v for k, v in e.items() if v is not None and v != "<unset>"}


def cli(module: str, *args: str, cwd: Path, environ: dict[str, str], timeout: int = 400):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=timeout)


def one_block(proc: subprocess.CompletedProcess) -> str:
    """Exit 2, the invalid-configuration block, no traceback, Ray never started."""
    err = proc.stderr
    assert proc.returncode == 2, err[-3000:]
    assert "[pipeline] invalid configuration" in err and "Traceback" not in err, err[-3000:]
    assert "Started a local Ray" not in err and "ray.init" not in err, err[-3000:]
    return err


# ---- 1. evaluation --------------------------------------------------------------------------
def test_evaluation_has_its_own_dir_beside_the_run():
    c = compose_cfg("+experiment=toy", "evaluate.checkpoint=runs/toy/checkpoints/step_000003",
                    name="eval", hydra=True)
    out = str(c.hydra.run.dir)
    assert out.startswith("runs/toy/eval/step_000003/holdout_"), out
    plain = compose_cfg("+experiment=toy", name="eval", hydra=True)
    assert str(plain.hydra.run.dir).startswith("runs/toy-eval/holdout_")


def test_laptop_evaluates_its_one_task_and_holdout_says_what_to_change(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the laptop default is a CPU box's")
    c = preflight(compose_cfg("+experiment=kernel_multiturn"))
    assert c.evaluate.split == "train"  # its one task (reward.task_ids) is a training task
    proc = cli("pipeline.evaluate", "+experiment=kernel_multiturn", "evaluate.split=holdout",
               cwd=tmp_path, environ=env(tmp_path))
    err = one_block(proc)
    assert "evaluate.split='holdout' has no tasks" in err and "evaluate.split=train" in err


def _fake_run(run: Path) -> Path:
    """A training run's files and a checkpoint whose model is the tiny Qwen2 in HF format."""
    from tests.pipeline.conftest import save_tiny_checkpoint
    from pipeline.models import load_model_config

    ckpt = run / "checkpoints" / "step_000003"
    save_tiny_checkpoint(str(ckpt / "model"), load_model_config("tiny").tiny)
    with open(ckpt / "loop.pt", "wb") as f:
        pickle.dump({"step": 3}, f)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i}) + "\n" for i in range(8)))
    (run / "config.json").write_text('{"name": "toy"}')
    (run / "wandb_run_id").write_text("trainrun")
    return ckpt


@pytest.mark.slow
def test_evaluate_never_writes_into_the_training_run(tmp_path):
    run = tmp_path / "runs" / "toy"
    ckpt = _fake_run(run)
    before = {p: p.read_bytes() for p in run.iterdir() if p.is_file()}
    proc = cli("pipeline.evaluate", "+experiment=toy", f"evaluate.checkpoint={ckpt}", "evaluate.k=2",
               "evaluate.ks=[1,2]", "evaluate.max_tasks=1", "rollout.turns=1", "logger.mode=offline",
               "resources.ray.num_cpus=8", "logger.table_every=0", cwd=tmp_path, environ=env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert {p: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert not (run / ".hydra").exists()
    (out,) = (run / "eval" / "step_000003").iterdir()
    assert out.name.startswith("holdout_")
    assert json.loads((out / "eval.json").read_text())["eval/samples"] == 2.0
    assert (out / "wandb_run_id").read_text().strip() != "trainrun"
    assert json.loads((out / "config.json").read_text())["evaluate"]["checkpoint"] == str(ckpt)


# ---- 3. sweeps -----------------------------------------------------------------------------
def test_each_sweep_gets_its_own_dir_group_and_hint(tmp_path):
    from pipeline import checkpoint
    from pipeline.wandb_setup import sweep_group

    c = compose_cfg("+experiment=toy", hydra=True)
    d = str(c.hydra.sweep.dir)
    assert d.startswith("runs/toy-sweep/20"), d
    assert sweep_group("runs/toy-sweep/2026-12-06_17-00-00") == "toy-sweep/2026-12-06_17-00-00"
    assert sweep_group("/tmp/mine") == "mine"
    (tmp_path / "config.json").write_text(json.dumps({"algorithm": {"gamma": 0.6}}))
    with pytest.raises(checkpoint.ResumeMismatch, match="hydra.sweep.dir=<dir>"):
        checkpoint.check_resume_config("auto", tmp_path, {"algorithm": {"gamma": 0.9}},
                                       dir_key="hydra.sweep.dir")


@pytest.mark.slow
def test_a_second_sweep_starts_fresh_and_an_own_model_runs_on_cpu(tmp_path):
    """Two sweeps of the same experiment, one after the other: each its own dir (the second one
    was refused before). The second one runs an own HF model dir (model=local) on the CPU: the
    laptop profile, the hf engine's keys only (one end-to-end run for items 2 and 3)."""
    from pipeline.models import load_model_config
    from tests.pipeline.conftest import save_tiny_checkpoint

    own = save_tiny_checkpoint(str(tmp_path / "hf"), load_model_config("tiny").tiny)
    args = ["-m", "+experiment=toy", "algorithm.gamma=0.6", "pipeline.steps=1", *SMALL]
    for extra in ([], ["model=local", f"model.path={own}"]):
        proc = cli("pipeline.main", *args, *extra, cwd=tmp_path, environ=env(tmp_path))
        assert proc.returncode == 0, proc.stderr[-4000:]
        time.sleep(1.1)  # a sweep dir per second
    import torch

    if not torch.cuda.is_available():
        assert "laptop profile (no GPU visible)" in proc.stderr, proc.stderr[-3000:]
    sweeps = sorted((tmp_path / "runs" / "toy-sweep").iterdir())
    assert len(sweeps) == 2 and all((s / "0" / "metrics.jsonl").exists() for s in sweeps)
    assert json.loads((sweeps[1] / "0" / "config.json").read_text())["model"]["path"] == own


# ---- 4. Ctrl-C -------------------------------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_checkpoints_like_sigterm(tmp_path):
    run = tmp_path / "run"
    metrics = run / "metrics.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.main", "+experiment=toy", "pipeline.steps=6",
         "checkpoint.every=0", "checkpoint.at_end=false", f"hydra.run.dir={run}", *SMALL],
        cwd=tmp_path, env=env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)  # its own process group, as a terminal's foreground job
    try:
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text().strip()) and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: every process of the group
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    assert "stop requested" in out and "the same command continues at step" in out, out[-3000:]
    assert out.count("Traceback") == 0, out[-4000:]
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")], out[-3000:]


# ---- 6. W&B ----------------------------------------------------------------------------------
def test_wandb_environment_variables_are_honoured(tmp_path, monkeypatch):
    import wandb

    from pipeline.metrics import MetricsLogger

    for k, v in dict(WANDB_PROJECT="p44", WANDB_NAME="n44", WANDB_TAGS="a,b",
                     WANDB_DIR=str(tmp_path / "wb"), WANDB_ENTITY="team").items():
        monkeypatch.setenv(k, v)
    c = preflight(compose_cfg("+experiment=toy", "logger.mode=disabled"))
    seen = {}

    class Run:
        id = "dummy-123"

        def finish(self):
            pass

    monkeypatch.setattr(wandb, "init", lambda **kw: seen.update(kw) or Run())
    MetricsLogger(c.logger, tmp_path / "run", run_name="toy", resolved_config={}).close()
    assert (seen["project"], seen["name"], seen["tags"], seen["entity"], seen["dir"]) == \
        ("p44", "n44", ["a", "b"], "team", str(tmp_path / "wb"))
    assert seen["job_type"] == "train"
    assert not (tmp_path / "run" / "wandb_run_id").exists()  # a disabled run's id is a dummy
    c2 = preflight(compose_cfg("+experiment=toy", "logger.project=mine"))
    assert c2.logger.project == "mine"  # the config, where it sets one, wins


def test_online_without_a_key_fails_before_ray(tmp_path):
    err = one_block(cli("pipeline.main", "+experiment=toy", "logger.mode=online", cwd=tmp_path,
                        environ=env(tmp_path)))
    assert "WANDB_API_KEY" in err and "logger.mode=offline" in err


# ---- 7. errors before Ray --------------------------------------------------------------------
def test_dependency_and_schedule_errors_come_in_one_block_before_ray(tmp_path):
    import importlib.util

    args = ["+experiment=toy", "pipeline.mode=sync", "pipeline.max_staleness=2"]
    vllm_missing = importlib.util.find_spec("vllm") is None
    if vllm_missing:
        args.append("rollout=vllm")
    err = one_block(cli("pipeline.main", *args, cwd=tmp_path, environ=env(tmp_path)))
    assert "pipeline.mode='sync'" in err or "pipeline.mode=sync" in err, err
    if vllm_missing:
        assert "vLLM is not installed" in err


def test_a_renamed_key_is_named_with_its_new_name(tmp_path):
    """An override written for an earlier release (the weight push was ``weight_sync``, the score
    timeout ``eval_timeout_s``) gets its new name, not Hydra's "not in PipelineConfig"."""
    err = one_block(cli("pipeline.main", "+experiment=toy", "pipeline.weight_sync=nccl", "rollout.eval_timeout_s=5",
                        cwd=tmp_path, environ=env(tmp_path)))
    assert "pipeline.weight_sync: renamed pipeline.weight_push" in err, err
    assert "rollout.eval_timeout_s: renamed rollout.score_timeout_s" in err, err


def test_a_negative_build_worker_count_fails_before_ray(tmp_path):
    err = one_block(cli("pipeline.main", "+experiment=toy", "resources.builds.workers=-1", cwd=tmp_path,
                        environ=env(tmp_path)))
    assert "resources.builds.workers=-1" in err, err


# ---- 2. an own model on any box ----------------------------------------------------------------
def test_hub_ids_are_accepted_and_offline_says_so(monkeypatch):
    from pipeline.hub import is_hub_id

    assert is_hub_id("Qwen/Qwen2.5-0.5B-Instruct") and not is_hub_id("./models/x") \
        and not is_hub_id("/abs/dir") and not is_hub_id("tiny")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"model.path='no-such-org-44/no-such-model'.*Hub"):
        preflight(compose_cfg("+experiment=toy", "model=local", "model.path=no-such-org-44/no-such-model"))


def test_own_model_on_cpu_gets_the_laptop_profile_and_only_hf_keys(tmp_path):
    import torch

    from pipeline.config import resolved_profile
    from pipeline.models import load_model_config
    from tests.pipeline.conftest import save_tiny_checkpoint

    if torch.cuda.is_available():
        pytest.skip("a CPU box's profile")
    d = save_tiny_checkpoint(str(tmp_path / "hf"), load_model_config("tiny").tiny)
    c = preflight(compose_cfg("+experiment=kernel_multiturn", "model=local", f"model.path={d}"))
    assert resolved_profile(c) == "laptop" and c.reward.backend == "cpu"
    assert c.rollout.engine.type == "hf"
