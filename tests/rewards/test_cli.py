import json

import pytest

from rewards.cli import main
from rewards.solutions import load_solution


def response_file(tmp_path, code, name="resp.txt"):
    path = tmp_path / name
    path.write_text(f"<think>hmm</think>One kernel.\n```python\n{code}\n```\n")
    return str(path)


def test_tasks_and_prompt(capsys):
    assert main(["--set", "levels=[2]", "--set", "max_tasks=2", "tasks"]) == 0
    out = capsys.readouterr().out
    assert "train: 2 tasks" in out and "L2/" in out and "L1/" not in out
    assert main(["prompt", "L1/17_relu", "--backend", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "=== system ===" in out and "__global__" in out and "class Model(nn.Module)" in out


def test_check_reports_rules(tmp_path, capsys):
    good = response_file(tmp_path, load_solution("cpu", "L1/17_relu"))
    assert main(["check", good]) == 0
    assert "rules pass" in capsys.readouterr().out
    assert main(["check", good, "--backend", "triton"]) == 1
    assert "rule no_kernel" in capsys.readouterr().out


def test_bad_config_key_is_a_message_not_a_traceback(capsys):
    assert main(["--set", "bogus=1", "tasks"]) == 2
    assert "bogus" in capsys.readouterr().err


@pytest.mark.triton_interpreter
def test_score_in_the_sandbox(tmp_path, capsys):
    resp = response_file(tmp_path, load_solution("triton", "L1/17_relu"))
    assert main(["--config", "kernel_triton_cpu", "--set", "holdout_frac=0.0", "score", "L1/17_relu", resp,
                 "--json"]) == 0
    outcome = json.loads(capsys.readouterr().out)
    assert outcome["correct"] and abs(outcome["score"] - 0.3) < 1e-9 and outcome["summary"] == "One kernel."
