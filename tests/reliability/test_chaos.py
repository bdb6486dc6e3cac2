"""The small form of bench/chaos.py: one toy run (real ``python -m pipeline.main``) whose trainer
and sampler actors are SIGKILLed at seeded random moments of its first steps (seed 3 draws the
trainer first, then a sampler); it reaches its last step in the same process (the trainer
restarted from its checkpoint, no resume) and has trained exactly the samples an unfaulted run
trains (steps x tasks x trajectories: no sample lost, none counted twice). The full bench (20
runs, the reward spread) is in docs/reliability.md."""
import random

import pytest

from bench.chaos import run_one

STEPS, TASKS, TRAJ = 5, 2, 16  # +experiment=toy at laptop sizes: 2 tasks x 16 trajectories x 1 turn


@pytest.mark.slow
def test_a_toy_run_with_a_killed_trainer_and_sampler_trains_every_sample_once(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # step_s 0.3: both moments fall within ~1.5 s of the first logged step, before the run ends
    row = run_one(run_dir, STEPS, [f"pipeline.tasks_per_batch={TASKS}", f"rollout.n_trajectories={TRAJ}"],
                  kills=2, victims=["sampler", "trainer"], step_s=0.3, rng=random.Random(3),
                  max_resumes=0, timeout_s=300)
    log = (tmp_path / "run.log").read_text()
    assert row["rc"] == 0, log[-3000:]
    assert row["kills"] == 2, row
    assert row["restarts"] == 1 and row["resumes"] == 0, row  # restarted in the run, not resumed
    assert "starting a replacement" in log
    assert row["reached_end"] and row["steps_done"] == STEPS, row
    assert row["trained_samples"] == STEPS * TASKS * TRAJ, row
