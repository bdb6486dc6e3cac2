"""A trainer actor SIGKILLed mid-run is restarted inside the same run (real ``pipeline.main.run``,
real Ray, tiny Qwen2 on FSDP2/gloo, the toy env): the loss surfaces when the loop next asks the
rank for something (here the checkpoint of step 3), the group starts again from the checkpoint of
step 1, the samplers get its weights, and steps 2 and 3 are trained again with the same batches:
their metrics (loss, gradient norm, reward of the batch) equal the first pass's, which holds only
if the weights *and* the optimizer state were restored. Each step is logged once."""
import os
import signal
import time

import psutil
import pytest

import pipeline.main as main_mod
from pipeline.main import run
from pipeline.metrics import MetricsLogger
from tests.pipeline.test_e2e import TOY, config, metrics_lines

STEPS, SAMPLES = 4, 2 * 16  # laptop toy: 2 tasks x 16 trajectories a batch


def _our_trainer_pids() -> list[int]:
    """Trainer actors of this test's own Ray (descendants of this process), never another's."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if " ".join(p.cmdline()).startswith("ray::TrainerWorker"):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def test_a_killed_trainer_restarts_from_the_checkpoint_and_redoes_its_steps(ray_local, tmp_path,
                                                                             monkeypatch, capfd):
    first: dict[int, dict] = {}
    sessions = []
    log = MetricsLogger.log

    def log_and_kill(self, step, metrics):
        log(self, step, metrics)
        if step not in first:
            first[step] = dict(metrics)
            if step == 3:  # before the checkpoint of step 3 is written
                pids = _our_trainer_pids()
                assert len(pids) == 1, pids
                os.kill(pids[0], signal.SIGKILL)
                while psutil.pid_exists(pids[0]) and psutil.Process(pids[0]).status() != "zombie":
                    time.sleep(0.05)

    class Recorded(main_mod.Session):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            sessions.append(self)

    monkeypatch.setattr(MetricsLogger, "log", log_and_kill)
    monkeypatch.setattr(main_mod, "Session", Recorded)
    run(config(*TOY, f"pipeline.steps={STEPS}", "checkpoint.every=2", "pipeline.max_trainer_restarts=1"),
        tmp_path)
    err = capfd.readouterr().err
    assert "trainer lost at step 3" in err and "restart 1 of 1" in err, err[-3000:]
    lines = metrics_lines(tmp_path)
    assert [m["step"] for m in lines] == list(range(STEPS))  # each step once, the redone ones' last
    assert sum(m["perf/samples"] for m in lines) == STEPS * SAMPLES
    assert [m["pipeline/trainer_restarts"] for m in lines] == [0, 0, 1, 1]
    for m in lines[2:]:  # the same batch, the same restored weights and Adam moments
        was = first[m["step"]]
        assert m["critic/score/mean"] == pytest.approx(was["critic/score/mean"], abs=1e-9)
        for key in ("actor/loss", "actor/grad_norm", "actor/pg_loss"):
            if key in was:
                assert m[key] == pytest.approx(was[key], rel=1e-4, abs=1e-6), key
    events = sessions[0].loop.events
    r = events.index(("restart", 3, 2))
    assert events[r + 1:r + 2] == [("push", 2, 1)]  # the samplers at the restored version first
    assert [e[1] for e in events[r:] if e[0] == "train"] == [2, 3]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001", "step_000003"]
