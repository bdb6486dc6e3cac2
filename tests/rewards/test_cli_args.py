"""rewards.cli: --config/--set on either side of the subcommand, --profile for prompt, and every
command names the backend it used (a CUDA answer checked under the default cpu backend says so)."""
from rewards.cli import main
from tests.rewards.test_cli import response_file

CUDA_ANSWER = '''import torch
from torch.utils.cpp_extension import load_inline
src = "__global__ void relu(float* x) {}"
ext = load_inline(name="r", cpp_sources="", cuda_sources=src, functions=[])
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.relu(x)
'''


def test_set_and_config_go_before_or_after_the_subcommand(capsys):
    assert main(["--set", "levels=[2]", "tasks", "--set", "max_tasks=2"]) == 0
    out = capsys.readouterr().out
    assert "train: 2 tasks" in out and "L1/" not in out
    assert main(["tasks", "--config", "kernel", "--set", "bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().err


def test_prompt_takes_a_profile_and_names_the_backend(capsys):
    assert main(["prompt", "L1/17_relu", "--profile", "full", "--backend", "cuda"]) == 0
    captured = capsys.readouterr()
    assert "backend: cuda (profile full" in captured.err and "=== system ===" in captured.out


def test_check_names_the_backend_and_hints_at_another(tmp_path, capsys):
    resp = response_file(tmp_path, CUDA_ANSWER)
    main(["check", resp])
    out = capsys.readouterr().out
    assert out.startswith("backend: cpu")
    # it passes the cpu rules: the output must not read as checked for CUDA
    assert "rules pass (the cpu backend's)" in out and "--backend cuda" in out
