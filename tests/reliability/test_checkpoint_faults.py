"""A checkpoint write that fails (unwritable run dir, full disk mid-write, the same step again)
fails loudly, leaves no partial directory, and leaves the previous checkpoint loadable: resume=auto
still finds it. The writer is a small real torch module (the trainer's own save is tested in
tests/pipeline); what is under test here is checkpoint.save's write-then-rename."""
import errno
import os

import pytest
import torch

from pipeline import checkpoint


class Writer:
    """Writes what a trainer writes (weights, optimizer state); can fail after a partial write."""

    def __init__(self, seed: int, fail: bool = False) -> None:
        torch.manual_seed(seed)
        self.model, self.fail = torch.nn.Linear(64, 64), fail

    def save(self, directory: str) -> None:
        os.makedirs(os.path.join(directory, "model"))
        torch.save(self.model.state_dict(), os.path.join(directory, "model", "weights.pt"))
        with open(os.path.join(directory, "optimizer.pt"), "wb") as f:
            f.write(b"\0" * 4096)  # half written when the disk fills up
            if self.fail:
                raise OSError(errno.ENOSPC, "No space left on device")


def weights(path) -> torch.Tensor:
    return torch.load(path / "model" / "weights.pt")["weight"]


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    good = checkpoint.save(root, 0, Writer(0), {"cursor": 1}, keep_last=1)
    w0 = weights(good).clone()
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.save(root, 1, Writer(1, fail=True), {"cursor": 2}, keep_last=1)
    msg = str(err.value)
    assert "step_000001" in msg and "No space left" in msg and "step_000000, is intact" in msg
    assert sorted(p.name for p in root.iterdir()) == ["step_000000"]  # no partial dir left behind
    assert checkpoint.resolve_resume("auto", root) == good
    assert checkpoint.load_loop_state(good)["cursor"] == 1 and torch.equal(weights(good), w0)
    # keep_last=1 pruned nothing: the failed save never counted as the latest


def test_saving_the_same_step_again_and_failing_keeps_the_old_copy(tmp_path):
    root = tmp_path / "checkpoints"
    good = checkpoint.save(root, 3, Writer(0), {"cursor": 4}, keep_last=0)
    w0 = weights(good).clone()
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.save(root, 3, Writer(1, fail=True), {"cursor": 4}, keep_last=0)
    assert torch.equal(weights(good), w0) and checkpoint.latest(root) == good
    again = checkpoint.save(root, 3, Writer(2), {"cursor": 4}, keep_last=0)
    assert again == good and not torch.equal(weights(good), w0)
    assert sorted(p.name for p in root.iterdir()) == ["step_000003"]


def test_an_unwritable_run_dir_fails_naming_it(tmp_path):
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run dir should be")
    root = blocker / "checkpoints"
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.save(root, 0, Writer(0), {"cursor": 1}, keep_last=1)
    assert str(root / "step_000000") in str(err.value) and "no earlier checkpoint" in str(err.value)
    assert blocker.read_text().startswith("a file")
