from dataclasses import replace

import pytest

from rewards.config import load_reward_config
from rewards.rules import RULES, RuleSettings, check_rules
from rewards.solutions import BACKENDS, available, load_solution
from tests.rewards.answers import ADVERSARIAL, CLEAN, CLEAN_TRITON, triton_answer

CFG = load_reward_config("kernel")
SETTINGS = RuleSettings.from_config(CFG.rules)


def broken(src: str, backend: str, enabled=None, settings=SETTINGS) -> set[str]:
    return {v.rule for v in check_rules(src, backend, enabled or CFG.rules.enabled, settings)}


@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_adversarial_answer_trips_its_rule(case):
    rule, src, backend = ADVERSARIAL[case]
    assert rule in broken(src, backend)


def test_every_rule_has_a_tripping_case_and_is_enabled_by_default():
    assert {rule for rule, _, _ in ADVERSARIAL.values()} == set(RULES)
    assert set(CFG.rules.enabled) == set(RULES)


@pytest.mark.parametrize("case", sorted(CLEAN))
def test_clean_answer_passes_every_rule(case):
    src, backend = CLEAN[case]
    assert broken(src, backend) == set()


@pytest.mark.parametrize("backend,task_id", [(b, t) for b in BACKENDS for t in available(b)])
def test_reference_solutions_pass_every_rule(backend, task_id):
    assert broken(load_solution(backend, task_id), backend) == set()


def test_disabled_rule_is_not_checked():
    _, src, backend = ADVERSARIAL["try_except_at_import"]
    enabled = [r for r in CFG.rules.enabled if r != "try_except"]
    assert "try_except" not in broken(src, backend, enabled=enabled)


def test_allowlist_is_configurable():
    # torch.empty_like is allowed by default; without it the clean answer's allocation trips the rule
    strict = replace(SETTINGS, allowed_torch_calls=SETTINGS.allowed_torch_calls - {"torch.empty_like"})
    assert "torch_compute_in_forward" in broken(CLEAN_TRITON, "triton", settings=strict)
    # and allowing a compute op lets it through
    relaxed = replace(SETTINGS, allowed_torch_calls=SETTINGS.allowed_torch_calls | {"torch.relu"})
    assert broken(triton_answer("", forward="return torch.relu(launch(x))"), "triton", settings=relaxed) == set()


def test_violation_reasons_name_the_line_and_the_call():
    _, src, backend = ADVERSARIAL["torch_fallback_in_forward"]
    reasons = [v.reason for v in check_rules(src, backend, ["torch_compute_in_forward"], SETTINGS)]
    assert any("torch.relu" in r and r.startswith("line ") for r in reasons)


def test_unknown_rule_name_is_an_error_naming_it():
    with pytest.raises(ValueError, match="no_such_rule"):
        check_rules(CLEAN_TRITON, "triton", ["no_such_rule"], SETTINGS)


def test_every_rule_has_a_description():
    for rule in RULES.values():
        assert rule.name and len(rule.description) > 20


@pytest.mark.parametrize("forward", [
    'out = {}\n        out["y"] = launch(x.contiguous())\n        return out["y"]',
    'self.cache_buf = launch(x.contiguous())\n        return self.cache_buf',
    'outs = [None]\n        outs[0] = launch(x.contiguous())\n        return outs[0]',
    'self.outs = {}\n        self.outs["y"] = launch(x.contiguous())\n        self.n = 1\n        return self.outs["y"]',
])
def test_dict_and_attribute_stores_are_not_tensor_writes(forward):
    assert broken(triton_answer("", forward=forward), "triton") == set()


@pytest.mark.parametrize("forward", [
    "y = launch(x.contiguous())\n        y[0] = 0\n        return y",
    "x[x < 0] = 0\n        return launch(x.contiguous())",
    "mask = x > 1\n        x[mask] = 0\n        return launch(x.contiguous())",
    'out = {}\n        out["y"] = launch(x.contiguous())\n        out["y"][0] = 1\n        return out["y"]',
    "self.buf = launch(x.contiguous())\n        self.buf[:, 0] = 1\n        return self.buf",
])
def test_indexed_writes_into_tensors_are_still_flagged(forward):
    reasons = [v.reason for v in check_rules(triton_answer("", forward=forward), "triton",
                                             ["torch_compute_in_forward"], SETTINGS)]
    assert any("indexed write into a tensor" in r for r in reasons), reasons


def test_build_argument_reasons_name_the_flag():
    _, src, backend = ADVERSARIAL["wrapper_in_extra_cflags"]
    reasons = [v.reason for v in check_rules(src, backend, ["build_arguments"], SETTINGS)]
    assert any("'-wrapper'" in r and "extra_cflags" in r and r.startswith("line ") for r in reasons), reasons


def test_non_literal_build_arguments_are_left_to_the_sandbox():
    src = CLEAN["allowed_build_flags"][0].replace('FLAGS = ["-O3"', 'FLAGS = list(["-wrapper"]) + ["-O3"')
    assert "build_arguments" not in broken(src, "cpu")
