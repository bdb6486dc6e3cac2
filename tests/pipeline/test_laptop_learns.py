"""The laptop default learns on the real kernel reward: the tiny Qwen2 warm-started on the cpu
answer corpus (pipeline.sft through the laptop's model.warm_start=kernel_sft, every variant of the
task's answers, wrong and broken ones weighted up), then GRPO+ with real sandbox evaluations
(compile-cache hits count), raises the mean reward of the last two steps over the first two. The
trainer is what raises it: with trainer.optim.lr=1e-9 added to LAPTOP (lr 0 is refused at start)
this test fails, the reward staying where the warm start put it (docs/sft.md)."""
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.config import register
from pipeline.main import run

CONF = Path(__file__).resolve().parents[2] / "conf"
# the laptop default (its one task; the warm start is not asked for: it is the laptop profile's
# default) in 6 steps instead of 8: under one_off, steps 0 and 1 sample the warm start and the
# measured runs had moved to 88-100 % correct by step 2 (docs/sft.md). 4 steps were too few: when
# none of step 0's 16 answers is correct (~1 run in 20 at the warm start's ~1/6), step 0 trains on
# nothing and the rise comes a step later (fresh-clone CI, 2026-12-04: 0.0 0.165 0.029 0.354)
LAPTOP = ["+experiment=kernel_multiturn", "profile=laptop", "logger=console", "pipeline.progress=false",
          "checkpoint.at_end=false", "pipeline.steps=6"]


def config(*overrides: str):
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def rewards_of(run_dir: Path) -> list[float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m["critic/score/mean"] for m in lines]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_warm_started_tiny_model_raises_the_kernel_reward(ray_local, kernel_cache_dir, tmp_path, capfd):
    # the session's compile cache (tests/rewards/test_corpus.py builds every corpus answer into it:
    # whichever runs first pays for the task's four builds) and the warm start cached beside it
    shared = [f"model.warm_start_dir={kernel_cache_dir}/warm_start", f"sandbox.cache_dir={kernel_cache_dir}"]
    cfg = config(*LAPTOP, *shared)
    assert cfg.model.warm_start == "kernel_sft"  # the laptop default
    run(cfg, tmp_path / "run", overrides=[*LAPTOP, *shared])
    rewards = rewards_of(tmp_path / "run")
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    err = capfd.readouterr().err
    assert "trains on nothing" not in err.split("[step 1]")[-1], err[-3000:]
    assert err.strip().splitlines()[-1].startswith("[pipeline] summary"), err[-3000:]
    assert last >= first + 0.15, rewards
