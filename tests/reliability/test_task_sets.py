"""Task sets as the run loads them (KernelEnv from reward config): a malformed file stops the start
naming the file, or is skipped with a warning when reward.skip_invalid_tasks; an empty set names
reward.tasks; a reference that raises at evaluation time is a reference_error (score 0, not the
answer's fault) and the pool goes on."""
import pytest

from rewards.config import load_reward_config
from rewards.env import KernelEnv
from rewards.score import score_result
from rewards.tasks import TaskError
from sandbox.pool import SandboxPool
from tests.sandbox.conftest import fixture_source

GOOD = fixture_source("tasks/relu.py")


def checkout(root, files: dict[str, str]):
    (root / "level1").mkdir(parents=True)
    for name, text in files.items():
        (root / "level1" / name).write_text(text)
    return root


def env(root, sandbox_cfg, **kw) -> KernelEnv:
    cfg = load_reward_config("kernel", backend="cpu", tasks=str(root), levels=[1], holdout_frac=0.0, **kw)
    return KernelEnv(cfg, SandboxPool(sandbox_cfg))


def test_malformed_task_file_is_named_or_skipped(tmp_path, sandbox_cfg, caplog):
    root = checkout(tmp_path, {"1_relu.py": GOOD, "2_broken.py": "class Model(:\n",
                               "3_no_inputs.py": GOOD.replace("def get_inputs", "def inputs")})
    with pytest.raises(TaskError) as err:
        env(root, sandbox_cfg, skip_invalid_tasks=False)
    assert "2_broken.py" in str(err.value) and "not valid Python" in str(err.value)
    e = env(root, sandbox_cfg, skip_invalid_tasks=True)
    assert [t.task_id for t in e.tasks("train")] == ["L1/1_relu"]
    assert "2_broken.py" in caplog.text and "3_no_inputs.py" in caplog.text


def test_an_empty_task_set_names_reward_tasks(tmp_path, sandbox_cfg):
    root = checkout(tmp_path, {"README.md": "no tasks here"})
    with pytest.raises(ValueError, match=r"reward.tasks=.*no tasks found"):
        env(root, sandbox_cfg, skip_invalid_tasks=False)
    root2 = checkout(tmp_path / "all_bad", {"1_bad.py": "def nope(:\n"})
    with pytest.raises(ValueError, match="no tasks found"):
        env(root2, sandbox_cfg, skip_invalid_tasks=True)


async def test_a_reference_that_raises_is_a_reference_error_not_the_answers(sandbox_cfg):
    broken_ref = GOOD.replace("return torch.relu(x)", "return torch.relu(x).view(7, -1, 3)")
    answer = fixture_source("answers/relu_python_correct.py")
    async with SandboxPool(sandbox_cfg) as pool:
        res = await pool.evaluate(broken_ref, answer, "cpu")
        assert res.error_kind == "reference_error" and not res.correct, res
        assert score_result(res, load_reward_config("kernel", backend="cpu")).score == 0.0
        after = await pool.evaluate(GOOD, answer, "cpu")
    assert after.correct, after
