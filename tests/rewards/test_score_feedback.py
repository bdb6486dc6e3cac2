import pytest

from rewards.config import load_reward_config
from rewards.feedback import parse_feedback, result_feedback, rules_feedback, trim_log
from rewards.parse import parse_response
from rewards.rules import Violation
from rewards.score import score_result
from sandbox.result import SandboxResult

CFG = load_reward_config("kernel")  # correct_weight 0.3, speedup_weight 1, cap 10, excessive -> zero


def correct(speedup, timed=True, flags=()):
    return SandboxResult(stage="done", compiled=True, correct=True, trials=5, trials_passed=5, timed=timed,
                      speedup=speedup, ref_runtime_ms=2.0, new_runtime_ms=2.0 / speedup if speedup else None,
                      flags=list(flags))


def test_score_is_kevin_formula():
    assert score_result(correct(2.0), CFG).score == pytest.approx(0.3 + 2.0)
    assert score_result(correct(0.5), CFG).score == pytest.approx(0.8)


def test_wrong_or_violating_answers_score_zero():
    wrong = SandboxResult(stage="correctness", compiled=True, correct=False, error_kind="wrong_output")
    assert score_result(wrong, CFG).score == 0.0
    assert score_result(correct(3.0), CFG, violations=True).score == 0.0


def test_cap_and_excessive_speedup_policies():
    assert score_result(correct(50.0), CFG).score == pytest.approx(0.3 + 10.0)
    flagged = correct(500.0, flags=["excessive_speedup"])
    zeroed = score_result(flagged, CFG)
    assert zeroed.score == pytest.approx(0.3) and "excessive" in zeroed.note
    capped = score_result(flagged, load_reward_config("kernel", excessive_speedup_policy="cap"))
    assert capped.score == pytest.approx(10.3)


def test_untimed_backend_earns_correctness_only():
    assert score_result(correct(None, timed=False), CFG).score == pytest.approx(0.3)
    assert score_result(correct(4.0, timed=False), CFG).score == pytest.approx(0.3)


def test_weights_are_configurable():
    cfg = load_reward_config("kernel", correct_weight=1.0, speedup_weight=0.0)
    assert score_result(correct(2.0), cfg).score == pytest.approx(1.0)


def test_trim_log_starts_at_first_error():
    log = "\n".join([f"[{i}/9] building object {i}" for i in range(40)] +
                    ["main.cpp:12:5: error: 'foo' was not declared in this scope", "   12 |   foo();"] +
                    ["note: more"] * 200)
    text = trim_log(log, 300)
    assert "error: 'foo' was not declared" in text and "building object 0" not in text
    assert len(text) <= 320 and text.endswith("(truncated)")


def test_trim_log_drops_build_noise_and_host_paths():
    log = ("FAILED: [code=1] main.o\n"
           "c++ -MMD -MF main.o.d -isystem /opt/venv/torch/include -c /cache/builds/ab12/ext/main.cpp -o main.o\n"
           "/cache/builds/ab12/ext/main.cpp: In function 'at::Tensor f(at::Tensor)':\n"
           "/cache/builds/ab12/ext/main.cpp:16:21: error: 'tanhh' is not a member of 'std'\n"
           "ninja: build stopped: subcommand failed.\n")
    text = trim_log(log, 1000)
    assert text.startswith("main.cpp: In function") and "main.cpp:16:21: error: 'tanhh'" in text
    assert "/cache/" not in text and "-isystem" not in text and "FAILED" not in text and "ninja" not in text
    tb = 'Traceback (most recent call last):\n  File "/tmp/w/cand.py", line 3, in forward\n    y = x.foo()\n' \
         "AttributeError: 'Tensor' object has no attribute 'foo'"
    assert trim_log(tb, 1000).startswith('File "cand.py", line 3, in forward')


def test_feedback_messages_by_outcome():
    compile_err = SandboxResult(stage="compile", error_kind="compile_error",
                             error="ninja: build stopped\nk.cpp:3:1: error: expected ';' before '}' token")
    assert "expected ';'" in result_feedback(compile_err, 500, 0.0)
    wrong = SandboxResult(stage="correctness", compiled=True, error_kind="wrong_output", which_output=1,
                       max_abs_err=0.5, max_rel_err=2.0, trials=5, trials_passed=0)
    text = result_feedback(wrong, 500, 0.0)
    assert "output 1" in text and "0.5" in text and "0/5" in text
    runtime = SandboxResult(stage="correctness", compiled=True, error_kind="runtime_error", error="RuntimeError: boom")
    assert "boom" in result_feedback(runtime, 500, 0.0)
    fast = result_feedback(correct(2.0), 500, 2.3)
    assert "2x" in fast and "faster" in fast.lower() and "1 ms" in fast
    assert "not timed" in result_feedback(correct(None, timed=False), 500, 0.3)
    assert "timed out" in result_feedback(SandboxResult(error_kind="compile_timeout"), 500, 0.0)
    rules = rules_feedback([Violation("try_except", "line 3: try/except ...")])
    assert "try_except" in rules and "line 3" in rules
    assert "```python" in parse_feedback(parse_response("no code here"))


def test_a_run_time_rule_violation_scores_zero_even_if_the_outputs_matched():
    caught = correct(5.0)
    caught.error_kind, caught.flags = "rule_violation", ["output_aliases_input"]
    assert score_result(caught, CFG).score == 0.0
    text = result_feedback(caught, 500, 0.0)
    assert "output_aliases_input" in text and "shares memory with an input" in text and "correct" not in text


def test_a_disabled_host_poison_scores_zero_with_its_reason():
    # the judge read glibc's poison setting off in the candidate's process
    caught = correct(3.0)
    caught.error_kind, caught.flags = "rule_violation", ["host_poison_disabled"]
    caught.error = "the host allocation poison was off after a correctness call (glibc's M_PERTURB read 0x0 ...)"
    assert score_result(caught, CFG).score == 0.0
    text = result_feedback(caught, 500, 0.0)
    assert "host_poison_disabled" in text and "M_PERTURB" in text and "unwritten" in text


def test_a_kernel_that_never_ends_is_told_so():
    hung = SandboxResult(stage="correctness", compiled=True, correct=False, error_kind="timeout",
                      error="one call of the answer did not finish within 20 s, 1000x the reference's 20 ms: ...")
    text = result_feedback(hung, 500, 0.0)
    assert "did not finish" in text and "never ends" in text and "20 s" in text and "indexing" not in text
