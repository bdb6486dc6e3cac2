"""W&B mode/group/name decisions, verl's metric names on the way out, the console line, and the
timeline reading the logged names. W&B itself is replaced by a recorder (never a server)."""
import json
import sys
import types
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from pipeline.logger_config import LoggerConfig
from pipeline.metrics import (MetricsLogger, env_metrics, score_latency_metrics, peak_flops, score_metrics,
                              with_perf)
from pipeline.sample import Sample
from pipeline.timeline import main as timeline_main, step_timings
from pipeline.wandb_setup import has_stored_login, resolve_mode, sweep_names
from rewards.interface import TurnOutcome
from tests.pipeline.test_e2e import CONF


def test_auto_mode_honours_wandb_mode_then_key_then_stored_login(tmp_path):
    home = {"HOME": str(tmp_path)}
    assert resolve_mode("auto", {**home, "WANDB_MODE": "online"})[0] == "online"
    assert resolve_mode("auto", {**home, "WANDB_MODE": "dryrun", "WANDB_API_KEY": "k"})[0] == "offline"
    assert resolve_mode("auto", {**home, "WANDB_MODE": "disabled"})[0] == "disabled"
    assert resolve_mode("auto", {**home, "WANDB_API_KEY": "k"})[0] == "online"
    assert resolve_mode("auto", home) == ("offline", "no WANDB_MODE, WANDB_API_KEY or stored login")
    # what `wandb login` writes; the key must not reach the reason that gets printed
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password SECRETKEY123\n")
    assert has_stored_login(home)
    mode, why = resolve_mode("auto", home)
    assert mode == "online" and "wandb login" in why and "SECRETKEY123" not in why
    assert not has_stored_login({**home, "WANDB_BASE_URL": "https://wandb.example.org"})
    (tmp_path / ".netrc").write_text("machine ??? garbage")  # malformed: as if absent
    assert resolve_mode("auto", home)[0] == "offline"
    # an explicit logger.mode is taken as written
    assert resolve_mode("offline", {**home, "WANDB_MODE": "online"})[0] == "offline"
    with pytest.raises(ValueError, match="logger.mode='cloud'"):
        resolve_mode("cloud", home)
    with pytest.raises(ValueError, match="WANDB_MODE='sometimes'"):
        resolve_mode("auto", {**home, "WANDB_MODE": "sometimes"})


def _hydra(mode, overrides, num=0):
    from hydra.types import RunMode

    return SimpleNamespace(mode=getattr(RunMode, mode), overrides=SimpleNamespace(task=overrides),
                           job=SimpleNamespace(num=num), sweep=SimpleNamespace(dir="runs/toy-sweep"))


def test_sweep_jobs_get_a_group_and_names_with_their_overrides():
    assert sweep_names("toy", _hydra("RUN", ["pipeline.steps=1"])) == ("toy", None)
    name, group = sweep_names("toy", _hydra("MULTIRUN", ["+experiment=toy", "algorithm.gamma=0.4",
                                                         "hydra.sweep.dir=x"], 1))
    assert name == "toy:algorithm.gamma=0.4" and group == "toy-sweep"
    assert sweep_names("toy", _hydra("MULTIRUN", [], 3))[0] == "toy:3"


class FakeWandb(types.ModuleType):
    def __init__(self, fail_online=False):
        super().__init__("wandb")
        self.inits, self.logged, self.fail_online = [], [], fail_online

    def init(self, **kw):
        self.inits.append(kw)
        if self.fail_online and kw["mode"] == "online":
            raise ConnectionError("no route to api.wandb.ai")
        fake = self
        return SimpleNamespace(id="run123", log=lambda d, step: fake.logged.append((step, d)),
                               finish=lambda: None)


def logger_cfg(**kw):
    cfg = OmegaConf.merge(OmegaConf.structured(LoggerConfig), OmegaConf.load(CONF / "logger" / "wandb.yaml"))
    for k, v in kw.items():
        OmegaConf.update(cfg, k, v)
    return cfg


def test_logger_offline_line_group_and_verl_names(tmp_path, monkeypatch, capsys):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("WANDB_MODE", "WANDB_API_KEY", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    log = MetricsLogger(logger_cfg(), tmp_path / "run", "toy:algorithm.gamma=0.4", {"a": 1},
                        group="toy-sweep", perf={"gpus": 2})
    err = capsys.readouterr().err
    assert err.count("W&B offline") == 1 and "wandb login" in err
    assert fake.inits[0]["mode"] == "offline" and fake.inits[0]["group"] == "toy-sweep"
    assert fake.inits[0]["name"] == "toy:algorithm.gamma=0.4"
    log.log(0, {"timing_s/step": 2.0, "critic/score/mean": 0.5, "response_length/clip_ratio": 0.25,
                "kernel/correct": 0.5, "batch/tokens": 400.0, "actor/grad_norm": 0.1})
    log.close()
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert row["timing_s/step"] == 2.0 and row["critic/score/mean"] == 0.5
    assert row["response_length/clip_ratio"] == 0.25 and row["kernel/correct"] == 0.5
    assert row["perf/throughput"] == 100.0  # 400 tokens / (2 s x 2 GPUs)
    assert fake.logged[0][1]["timing_s/step"] == 2.0
    # the console line names keys in full: no bare "step=" that reads as the step number
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[step 0]")][0]
    assert "timing_s/step=2" in line and "critic/score/mean=0.5" in line and " step=" not in line


def test_auto_falls_back_to_offline_when_online_fails(tmp_path, monkeypatch, capsys):
    fake = FakeWandb(fail_online=True)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_API_KEY", "k")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    MetricsLogger(logger_cfg(), tmp_path, "r", {}).close()
    assert [i["mode"] for i in fake.inits] == ["online", "offline"]
    assert "online failed: ConnectionError" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "wandb", FakeWandb(fail_online=True))
    with pytest.raises(ConnectionError):  # an explicit online is not second-guessed
        MetricsLogger(logger_cfg(mode="online"), tmp_path, "r", {})


def test_derived_perf_metrics():
    assert peak_flops("NVIDIA H200") == 989e12 and peak_flops(None) is None
    m = with_perf({"actor/tokens": 1000.0, "actor/rank_time_s": 2.0},
                  {"params": 1e9, "peak_flops": 1e15, "trainer_gpus": 2})
    assert m["perf/mfu/actor"] == pytest.approx(6e12 / 2.0 / 2e15)
    assert "perf/mfu/actor" not in with_perf({"actor/tokens": 1.0, "actor/rank_time_s": 1.0}, {})


def test_prompt_and_response_length_statistics():
    samples = [Sample(uid=f"0/t/{i}/0", step=0, task_id="t", traj=i, turn=0, prompt_ids=[1] * (i + 2),
                      response_ids=[2] * (i + 1), logprobs=[], finish_reason="stop", score=float(i),
                      policy_version=0, outcome=None) for i in range(3)]
    m = score_metrics(samples)
    assert (m["prompt_length/mean"], m["prompt_length/max"], m["prompt_length/min"]) == (3.0, 4.0, 2.0)
    assert m["response_length/min"] == 1.0


def test_one_evaluations_p95_from_the_samples_timestamps():
    samples = [Sample(uid=f"0/t/{i}/0", step=0, task_id="t", traj=i, turn=0, prompt_ids=[1],
                      response_ids=[2], logprobs=[], finish_reason="stop", score=0.0, policy_version=0,
                      t_gen_end=100.0 + i, t_eval_end=100.0 + i + 0.1 * (i + 1)) for i in range(20)]
    samples.append(Sample(uid="0/t/20/0", step=0, task_id="t", traj=20, turn=0, prompt_ids=[1],
                          response_ids=[2], logprobs=[], finish_reason="error", score=0.0,
                          policy_version=0))  # a failed generation has no evaluation
    m = score_latency_metrics(samples)
    assert m["timing_s/score_p50"] == pytest.approx(1.05) and m["timing_s/score_max"] == pytest.approx(2.0)
    assert m["timing_s/score_p95"] == pytest.approx(1.9)  # nearest rank: the 19th of 20
    assert score_latency_metrics(samples[-1:]) == {}
    # kernel env: only what the sandbox ran is an evaluation, not an answer that failed to parse
    samples[3].outcome = TurnOutcome(score=0.0, feedback="", evaluated=True)
    samples[7].outcome = TurnOutcome(score=0.0, feedback="", evaluated=True)
    samples[0].outcome = TurnOutcome(score=0.0, feedback="", evaluated=False)
    assert score_latency_metrics(samples)["timing_s/score_p95"] == pytest.approx(0.8)


def test_the_env_names_its_metrics_and_the_pipeline_reduces_them():
    def sample(i, metrics):
        return Sample(uid=f"0/t/{i}/0", step=0, task_id="t", traj=i, turn=0, prompt_ids=[1], response_ids=[2],
                      logprobs=[], finish_reason="stop", score=0.0, policy_version=0, outcome=TurnOutcome(score=0.0, feedback="", metrics=metrics))

    samples = [sample(0, {"sandbox/evals_per_min": 1.0, "sandbox/cache_hit_rate": 1.0, "sandbox/compile_s_p50": 9.0}),
               sample(1, {"sandbox/evals_per_min": 1.0, "sandbox/cache_hit_rate": 0.0, "sandbox/compile_s_p50": 1.0}),
               sample(2, {"sandbox/evals_per_min": 1.0, "sandbox/cache_hit_rate": 0.0, "sandbox/compile_s_p50": 2.0}),
               sample(3, {})]  # a toy-env turn names nothing
    assert env_metrics(samples, wall_s=30.0) == pytest.approx(
        {"sandbox/evals_per_min": 6.0, "sandbox/cache_hit_rate": 1 / 3, "sandbox/compile_s_p50": 2.0})
    assert env_metrics(samples[3:], wall_s=30.0) == {}


def test_timeline_reads_the_logged_names(tmp_path, capsys):
    assert step_timings({"timing_s/gen": 1.0, "timing_s/update_weights": 0.5}) == {"sampler": 1.0, "push": 0.5}
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "timing_s/step": 3.0}) + "\n")
    assert timeline_main([str(tmp_path)]) == 0
    assert "step 0: step=3.00s" in capsys.readouterr().out
    assert timeline_main([str(tmp_path / "nothing")]) == 2


def test_progress_bars_only_on_a_terminal(capsys):
    from pipeline.main import quiet_progress

    conf = OmegaConf.create({"pipeline": {"progress": True}})
    quiet_progress(conf)  # pytest's captured stderr is no terminal, as a log file is not
    assert conf.pipeline.progress is False and "progress bars off" in capsys.readouterr().err


def test_hugging_face_bars_are_off_in_the_actors_without_progress():
    """The trainer actor's save_pretrained drew "Writing model shards" bars into a log file."""
    import os
    import subprocess

    from pipeline.main import actor_env_vars

    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in actor_env_vars(progress=True)
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    probe = [sys.executable, "-c", "from transformers.utils import logging; print(logging.is_progress_bar_enabled())"]
    on = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=120)
    off = subprocess.run(probe, env={**env, **actor_env_vars(progress=False)}, capture_output=True,
                         text=True, timeout=120)
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False")


def test_perf_context_counts_shared_gpus_once():
    from pipeline.main import perf_context

    cfg = OmegaConf.create({"resources": {"sampler": {"gpus": 1}, "trainer": {"gpus": 1},
                                          "evaluator": {"gpus": 1}}})
    info = {"params": 7e9, "device_name": "NVIDIA H200"}
    assert perf_context(cfg, info, colocated=True) == {"gpus": 2, "trainer_gpus": 1, "params": 7e9,
                                                       "peak_flops": 989e12}
    assert perf_context(cfg, None, colocated=False)["gpus"] == 3


def test_samples_jsonl_has_every_scored_turn_and_a_resume_drops_the_steps_run_again(tmp_path):
    cfg = logger_cfg(backends=["jsonl"])

    def turn(step, traj, correct):
        verdict = {"new_runtime_ms": 0.5, "ref_runtime_ms": 1.0, "flags": ["timing_cut"], "wall_s": {"total": 3.2}}
        outcome = TurnOutcome(score=1.3 if correct else 0.0, feedback="", parse_ok=True, compiled=True,
                              correct=correct, speedup=2.0 if correct else None,
                              error_kind=None if correct else "wrong_output", verdict=verdict)
        return Sample(uid=f"{step}/L1/19_ReLU/{traj}/0", step=step, task_id="L1/19_ReLU", traj=traj, turn=0,
                      prompt_ids=[1], response_ids=[2, 3, 4], logprobs=[], finish_reason="stop",
                      score=outcome.score, policy_version=step, outcome=outcome, t_gen_start=1.0, t_gen_end=2.5)

    log = MetricsLogger(cfg, tmp_path, "r", {})
    for step in range(3):
        log.log_samples([turn(step, 0, True), turn(step, 1, False)])
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(x["step"], x["traj"]) for x in lines] == [(s, t) for s in range(3) for t in (0, 1)]
    first = lines[0]
    assert (first["task"], first["score"], first["speedup"], first["correct"]) == ("L1/19_ReLU", 1.3, 2.0, True)
    assert (first["new_ms"], first["ref_ms"], first["flags"], first["eval_s"], first["gen_s"]) == \
        (0.5, 1.0, ["timing_cut"], 3.2, 1.5)
    assert lines[1]["error_kind"] == "wrong_output" and lines[1]["response_tokens"] == 3
    # resumed from the checkpoint of step 1: steps 1 and 2 are sampled again
    log = MetricsLogger(cfg, tmp_path, "r", {}, resume=True, start_step=1)
    log.log_samples([turn(1, 5, True)])
    log.rewind(1)  # a restarted trainer: step 1 again
    log.log_samples([turn(1, 6, True)])
    log.close()
    again = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(x["step"], x["traj"]) for x in again] == [(0, 0), (0, 1), (1, 6)]
    cfg.samples = False
    MetricsLogger(cfg, tmp_path / "off", "r", {}).log_samples([turn(0, 0, True)])
    assert not (tmp_path / "off" / "samples.jsonl").exists()
