import json
import subprocess
import sys

import pytest

from tests.sandbox.conftest import FIXTURES


def _cli(*args, cache_dir):
    return subprocess.run([sys.executable, "-m", "sandbox.eval", "--cache-dir", cache_dir, "--runs", "3",
                           "--trials", "2", *args], capture_output=True, text=True, timeout=600)


def test_cli_prints_a_readable_verdict(kernel_cache_dir):
    out = _cli("--task", str(FIXTURES / "tasks/relu.py"), "--answer",
               str(FIXTURES / "answers/relu_python_correct.py"), cache_dir=kernel_cache_dir)
    assert out.returncode == 0, out.stderr
    assert "verdict   : CORRECT" in out.stdout and "speedup" in out.stdout


@pytest.mark.triton_interpreter
def test_cli_json_parses_and_a_wrong_answer_still_exits_zero(kernel_cache_dir):
    out = _cli("--task", str(FIXTURES / "tasks/rowsum.py"), "--answer",
               str(FIXTURES / "answers/rowsum_triton_wrong_axis.py"), "--backend", "triton", "--json",
               cache_dir=kernel_cache_dir)
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)
    assert verdict["correct"] is False and verdict["error_kind"] == "wrong_output"


def test_cli_names_a_missing_file(kernel_cache_dir):
    out = _cli("--task", "/nonexistent/task.py", "--answer", str(FIXTURES / "answers/relu_python_correct.py"),
               cache_dir=kernel_cache_dir)
    assert out.returncode != 0 and "/nonexistent/task.py" in out.stderr
