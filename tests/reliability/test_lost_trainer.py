"""A lost actor the loop cannot replace (a trainer rank) stops the run with a message that says
where the last checkpoint is and how to continue. The error is a real one from a killed actor."""
import time
from types import SimpleNamespace

from pipeline.main import _is_lost_actor, lost_actor_message


class Rank:
    def step(self) -> int:
        return 1


def _first_error_after_kill(ray, actor) -> BaseException:
    """ray.kill is asynchronous: a call made right after it may still run. Call until one fails."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(actor.step.remote(), timeout=30)
        except Exception as e:  # noqa: BLE001 - the error under test
            return e
        time.sleep(0.1)
    raise AssertionError("the killed actor kept answering for 60 s")


def test_a_killed_actor_is_recognised_and_the_message_names_the_checkpoint(ray_local, tmp_path):
    ray = ray_local
    rank = ray.remote(num_cpus=0.01)(Rank).remote()
    assert ray.get(rank.step.remote()) == 1
    ray.kill(rank)
    error = _first_error_after_kill(ray, rank)
    assert _is_lost_actor(error) and not _is_lost_actor(ValueError("bad batch"))

    conf = SimpleNamespace(checkpoint=SimpleNamespace(dir="checkpoints", every=5))
    msg = lost_actor_message(error, tmp_path, conf)
    assert "no checkpoint yet (checkpoint.every=5)" in msg and f"hydra.run.dir={tmp_path}" in msg
    step_dir = tmp_path / "checkpoints" / "step_000003"
    step_dir.mkdir(parents=True)
    (step_dir / "loop.pt").write_bytes(b"")  # what makes a directory a finished checkpoint
    msg = lost_actor_message(error, tmp_path, conf)
    assert f"the last checkpoint is {step_dir}" in msg and "resume=auto" in msg
