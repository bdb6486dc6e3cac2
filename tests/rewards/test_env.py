"""KernelEnv end to end with the real sandbox pool (real compiler, real Triton interpreter).

Cold compiles in this module: 3 (the cpu answer, its off-by-one twin, and a typo that fails to build). Triton runs in the
interpreter on CPU: no compile. Adversarial answers are rejected by the rules before the pool.
"""
import asyncio

import pytest

from rewards.config import load_reward_config
from rewards.env import KernelEnv
from rewards.interface import RewardEnv, TaskRef, Turn
from rewards.solutions import load_solution
from sandbox.config import load_default_config
from sandbox.pool import SandboxPool
from tests.rewards.answers import ADVERSARIAL

FUSED = "L2/9_scale_shift_tanh_residual"
RELU = "L1/17_relu"
SUM = "L1/7_sum_over_dim"


def reply(code: str, summary: str = "I wrote one fused kernel.") -> str:
    return f"<think>Let me think about memory traffic.</think>\n{summary}\n```python\n{code}\n```\n"


def make_env(backend: str, cache_dir: str) -> KernelEnv:
    cfg = load_reward_config("kernel", backend=backend, holdout_frac=0.0)
    return KernelEnv(cfg, SandboxPool(load_default_config(cache_dir=cache_dir)))


def ref(env: KernelEnv, task_id: str) -> TaskRef:
    (task,) = [t for t in env.tasks("train") if t.task_id == task_id]
    return task


async def test_cpu_correct_answer_scores_and_off_by_one_scores_zero(kernel_cache_dir):
    env = make_env("cpu", kernel_cache_dir)
    good = load_solution("cpu", FUSED)
    off_by_one = good.replace("for (int64_t i = 0; i < n; ++i)", "for (int64_t i = 0; i < n - 1; ++i)")
    typo = good.replace("std::tanh(", "std::tanhh(")
    assert off_by_one != good and typo != good
    task = ref(env, FUSED)
    try:
        ok, bad, broken = await asyncio.gather(env.score(task, reply(good)), env.score(task, reply(off_by_one)),
                                               env.score(task, reply(typo)))
    finally:
        await env.aclose()
    assert broken.score == 0.0 and not broken.compiled and broken.error_kind == "compile_error", broken.feedback
    assert "tanhh" in broken.feedback and "failed to compile" in broken.feedback
    assert len(broken.feedback) < 2000  # trimmed to the first errors
    assert ok.correct and ok.compiled and ok.parse_ok and ok.error_kind is None, ok.feedback
    assert ok.score > 0.3 and ok.speedup is not None and ok.score == pytest.approx(0.3 + min(ok.speedup, 10.0))
    assert "speedup" in ok.feedback and ok.summary == "I wrote one fused kernel." and "load_inline" in ok.answer
    assert ok.verdict["timed"] and ok.verdict["backend"] == "cpu"
    assert ok.evaluated and {"sandbox/evals_per_min", "sandbox/cache_hit_rate"} <= set(ok.metrics)
    assert bad.score == 0.0 and not bad.correct and bad.compiled and bad.error_kind == "wrong_output"
    assert "wrong" in bad.feedback and bad.hacks == []


@pytest.mark.triton_interpreter
async def test_triton_interpreter_answers_and_multi_turn_feedback(kernel_cache_dir):
    env = make_env("triton", kernel_cache_dir)
    relu = load_solution("triton", RELU)
    relu_off_by_one = relu.replace("mask = offs < n", "mask = offs < n - 1")
    # wrong reduction axis: with square tiles, summing over axis 1 gives row sums of the right shape
    sum_wrong_axis = load_solution("triton", SUM).replace("BLOCK_C=64", "BLOCK_C=32").replace(
        "tl.sum(tl.load(ptrs, mask=mask, other=0.0), axis=0)", "tl.sum(tl.load(ptrs, mask=mask, other=0.0), axis=1)")
    try:
        ok, off, axis, ok_sum = await asyncio.gather(
            env.score(ref(env, RELU), reply(relu)),
            env.score(ref(env, RELU), reply(relu_off_by_one, "Masked tail.")),
            env.score(ref(env, SUM), reply(sum_wrong_axis)),
            env.score(ref(env, SUM), reply(load_solution("triton", SUM))))
    finally:
        await env.aclose()
    for outcome in (ok, ok_sum):  # untimed backend: correctness credit only
        assert outcome.correct and outcome.score == pytest.approx(0.3), outcome.feedback
        assert outcome.verdict["timed"] is False
    for outcome in (off, axis):
        assert outcome.score == 0.0 and outcome.error_kind == "wrong_output", outcome.feedback
    # the next turn sees the summary, the code and the feedback, not the reasoning
    msgs = env.messages(ref(env, RELU), [Turn(off.summary, off.answer, off.feedback)])
    assert msgs[2]["content"].startswith("Masked tail.") and "offs < n - 1" in msgs[2]["content"]
    assert off.feedback in msgs[3]["content"]
    assert all("memory traffic" not in m["content"] for m in msgs)


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=pytest.mark.triton_interpreter), "cpu", "cuda"])
async def test_adversarial_answers_score_zero_with_the_rule_name(backend, kernel_cache_dir):
    env = make_env(backend, kernel_cache_dir)
    cases = {k: v for k, v in ADVERSARIAL.items() if v[2] == backend}
    assert cases
    task = env.tasks("train")[0]
    try:
        outcomes = await asyncio.gather(*(env.score(task, reply(src)) for _, src, _ in cases.values()))
    finally:
        await env.aclose()
    for (case, (rule, _, _)), outcome in zip(cases.items(), outcomes):
        assert outcome.score == 0.0, case
        assert rule in outcome.hacks, (case, outcome.hacks)
        assert rule in outcome.feedback and outcome.error_kind in ("rule_violation", "no_model_new"), case
        assert outcome.verdict["violations"]
    assert env.pool.stats().get("evaluations", 0) == 0  # rejected before any sandbox run


@pytest.mark.parametrize("response,kind", [
    ("", "empty"),
    ("<think>I will write a kernel... (cut at max length)", "empty"),
    ("\x00\x07\x1b" * 100, "binary_junk"),
    ("Just use torch.", "no_code_block"),
    ("```python\nclass ModelNew(nn.Module):\n    def forward(self, x):\n", "unterminated_code_block"),
    ("```python\nclass ModelNew(nn.Module)\n    pass\n```", "syntax_error"),
    ("x" * 200_001, "too_long"),
])
async def test_unusable_responses_score_zero_and_never_raise(response, kind, kernel_cache_dir):
    env = make_env("cpu", kernel_cache_dir)  # none reaches the sandbox: any backend
    try:
        outcome = await env.score(env.tasks("train")[0], response)
    finally:
        await env.aclose()
    assert outcome.score == 0.0 and outcome.error_kind == kind and not outcome.parse_ok
    # never run by the sandbox, yet counted as an evaluation (as pipeline.metrics always did)
    assert not outcome.evaluated and outcome.metrics == {"sandbox/evals_per_min": 1.0, "sandbox/cache_hit_rate": 0.0}
    assert "```python" in outcome.feedback


@pytest.mark.triton_interpreter
async def test_answer_that_fails_to_load_is_scored_by_the_sandbox(kernel_cache_dir):
    env = make_env("triton", kernel_cache_dir)
    code = "import not_a_real_module_xyz\n" + load_solution("triton", RELU)
    try:
        outcome = await env.score(ref(env, RELU), reply(code))
    finally:
        await env.aclose()
    assert outcome.score == 0.0 and outcome.parse_ok and outcome.error_kind in ("load_error", "runtime_error")
    assert "not_a_real_module_xyz" in outcome.feedback


class BrokenPool:
    """An evaluator whose every call fails: the env must turn that into a scored outcome."""

    calls = 0

    async def evaluate(self, *args, **kwargs):
        BrokenPool.calls += 1
        raise ConnectionError("evaluator process lost")


async def test_evaluator_failure_is_a_zero_score_not_an_exception():
    env = KernelEnv(load_reward_config("kernel", backend="cpu", holdout_frac=0.0), BrokenPool())
    outcome = await env.score(ref(env, RELU), reply(load_solution("cpu", RELU)))
    assert BrokenPool.calls == 1
    assert outcome.score == 0.0 and outcome.error_kind == "sandbox_error" and "lost" in outcome.feedback


def test_env_implements_the_interface_and_splits():
    env = KernelEnv(load_reward_config("kernel"), eval_pool=None)
    assert isinstance(env, RewardEnv)
    train, hold = env.tasks("train"), env.tasks("holdout")
    assert len(train) + len(hold) >= 40 and hold and {t.task_id for t in train}.isdisjoint(t.task_id for t in hold)
    assert [t.task_id for t in env.tasks("train")] == [t.task_id for t in train]
    # a TaskRef that lost its payload (e.g. serialised by id only) still resolves
    assert env.messages(TaskRef(train[0].task_id), [])[1]["content"] == env.messages(train[0], [])[1]["content"]
    with pytest.raises(ValueError, match="split"):
        env.tasks("validation")
    small = KernelEnv(load_reward_config("kernel", max_tasks=3, levels=[2]), eval_pool=None)
    assert len(small.tasks("train")) == 3 and all(t.task_id.startswith("L2/") for t in small.tasks("train"))


def test_bad_config_values_are_named():
    with pytest.raises(ValueError, match="reward.tasks"):
        KernelEnv(load_reward_config("kernel", tasks="/no/such/checkout"), eval_pool=None)
    with pytest.raises(ValueError, match="reward.rules.enabled"):
        load_reward_config("kernel", **{"rules.enabled": ["no_kernel", "bogus_rule"]})


def test_the_triton_backend_without_a_gpu_stops_on_a_broken_interpreter(monkeypatch, tmp_path):
    from sandbox import devices

    monkeypatch.setattr(devices, "interpreter_problem", lambda: "triton 3.6.0 with numpy 2.4.6 fails")
    monkeypatch.setattr(devices, "detect_gpus", lambda: [])
    with pytest.raises(ValueError, match="reward.backend=triton: triton 3.6.0"):
        make_env("triton", str(tmp_path))
    make_env("cpu", str(tmp_path))  # the other backends do not use the interpreter
