"""The whole pipeline in-process on CPU (real Ray actors, tiny Qwen2, FSDP2 on gloo): both
schedules learn ToyEnv and write metrics, a timeline and a checkpoint; the timeline proves
overlap in one_off and none in sync; the real cpu kernel env runs a step; resume continues at
the right step with the carried batch; a wrong key fails naming it."""
import json
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.config import register
from pipeline.main import run
from pipeline.timeline import Timeline

CONF = Path(__file__).resolve().parents[2] / "conf"


def config(*overrides: str):
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def metrics_lines(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


TOY = ["+experiment=toy", "logger=console", "pipeline.progress=false", "checkpoint.keep_last=0"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one_off", "sync"])
def test_toy_learns_through_the_pipeline(ray_local, tmp_path, mode):
    steps = 12
    run(config(*TOY, f"pipeline.mode={mode}", f"pipeline.steps={steps}", "checkpoint.every=6"),
        tmp_path)
    lines = metrics_lines(tmp_path)
    assert [m["step"] for m in lines] == list(range(steps))
    rewards = [m["critic/score/mean"] for m in lines]  # logged under verl's name
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.1, rewards  # share of 'a' in the answers rises measurably (~0.04 -> ~0.3)
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["step_000005", "step_000011"]
    assert (tmp_path / "checkpoints" / "step_000011" / "model" / "config.json").exists()
    tl = Timeline.from_jsonl(tmp_path / "timeline.jsonl")
    lag = [m["pipeline/policy_lag"] for m in lines]
    if mode == "one_off":
        # batch N+1 was generated while batch N trained
        for n in range(steps - 1):
            assert tl.overlap("train", n, "gen", n + 1) > 0, n
        assert lag[1:] == [1.0] * (steps - 1)
    else:
        for n in range(steps):
            for m in range(steps):
                assert tl.overlap("train", n, "gen", m) == 0.0
        assert lag == [0.0] * steps
    for m in lines:
        for key in ("timing_s/gen", "timing_s/train", "timing_s/update_weights", "timing_s/step",
                    "pipeline/efficiency", "actor/grad_norm", "kernel/parse_ok", "response_length/mean",
                    "prompt_length/mean", "perf/throughput"):
            assert key in m, key


@pytest.mark.slow
def test_kernel_env_laptop_default(ray_local, tmp_path):
    """The real cpu kernel env (parsing, rules, sandbox) behind the laptop default experiment."""
    # the random tiny model (no warm start: tests/pipeline/test_laptop_learns.py has that) with
    # short responses: this test is about the env behind the loop, not about learning
    last = run(config("+experiment=kernel_multiturn", "logger=console", "pipeline.progress=false",
                      "pipeline.steps=2", "model.warm_start=null", "sandbox.cache_dir=null",
                      "rollout.max_response_length=48", "rollout.n_trajectories=4"), tmp_path)
    lines = metrics_lines(tmp_path)
    assert [m["step"] for m in lines] == [0, 1]
    assert "kernel/parse_ok" in last and 0.0 <= last["kernel/parse_ok"] <= 1.0
    assert (tmp_path / "checkpoints" / "step_000001" / "optimizer.pt").exists()
    assert (tmp_path / "timeline.png").exists()


@pytest.mark.slow
def test_resume_continues_with_the_carried_batch(ray_local, tmp_path):
    args = [*TOY, "pipeline.mode=one_off", "pipeline.steps=3", "checkpoint.every=1"]
    run(config(*args), tmp_path)
    original = metrics_lines(tmp_path)
    # as if the run had died after step 0's checkpoint
    for name in ("step_000001", "step_000002"):
        shutil.rmtree(tmp_path / "checkpoints" / name)
    run(config(*args, "resume=auto"), tmp_path)
    resumed = metrics_lines(tmp_path)
    assert [m["step"] for m in resumed] == [0, 1, 2]  # nothing lost, nothing twice
    assert resumed[0] == original[0]
    # step 1 trains the batch generated before the checkpoint: the very same samples
    assert resumed[1]["critic/score/mean"] == original[1]["critic/score/mean"]
    assert resumed[1]["actor/optim_steps"] == original[1]["actor/optim_steps"]
    # an already complete run does nothing more
    assert run(config(*args, "resume=auto"), tmp_path) == {}


def test_wrong_key_and_bad_values_are_named():
    with pytest.raises(Exception, match="lrr"):
        config("+experiment=toy", "trainer.optim.lrr=1")
    with pytest.raises(Exception, match="turns"):
        config("+experiment=toy", "rollout.turns=two")
    from pipeline.config import check

    cfg = config("+experiment=toy", "algorithm.clip_ratio_high=0.1", "rollout.turns=0")
    with pytest.raises(ValueError) as err:
        check(cfg)
    assert "algorithm.clip_ratio_high" in str(err.value) and "rollout.turns" in str(err.value)
