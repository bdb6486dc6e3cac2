"""Model responses that are empty, huge, binary or hostile: through KernelEnv they score 0 with a
reason for people (feedback) and a kind for metrics, never an exception and never a verdict that
blames the evaluator. None of them reaches a compiler."""
import asyncio

import pytest

from rewards.config import load_reward_config
from rewards.env import KernelEnv
from sandbox.pool import SandboxPool

FWD = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return "


def block(code: str) -> str:
    return f"I fused it.\n```python\n{code}\n```\n"


RESPONSES = {
    "empty": ("", "empty"),
    "whitespace_only": (" \n\t\n" * 1000, "empty"),
    "reasoning_never_closed": ("<think>" + "hmm " * 5000, "empty"),
    "binary": (bytes(range(256)).decode("latin-1") * 50, "binary_junk"),
    "nul_inside_code": (block("class ModelNew:\n    pass\x00"), "binary_junk"),
    "huge": ("a" * 5_000_000, "too_long"),
    "many_code_blocks": (block("pass") * 50_000, "too_long"),
    "lone_surrogate": (block("class ModelNew:\n    s = '\ud800'"), "syntax_error"),
    "zero_width_in_code": (block("class ModelNew\u200b:\n    pass"), "syntax_error"),
    "nested_past_the_parser": (block(FWD + " + ".join(["x"] * 5000)), "syntax_error"),
    "nested_past_the_rules": (block(FWD + " + ".join(["x"] * 1500)), "syntax_error"),
    "nested_lists": (block("x = " + "[" * 3000 + "]" * 3000), "syntax_error"),
    "unterminated_block": ("```python\n" + FWD + "x", "unterminated_code_block"),
    "no_model_new": (block("print('hello')"), "no_model_new"),
    "prose_only": ("I think the best approach is to use shared memory tiling. " * 100, "no_code_block"),
    "pure_torch_answer": (block(FWD + "torch.relu(x)"), "rule_violation"),
    "exec_of_hidden_code": (block("exec(bytes.fromhex('7072696e74283129').decode())\n" + FWD + "x"),
                            "rule_violation"),
}


@pytest.fixture
async def env(sandbox_cfg):
    e = KernelEnv(load_reward_config("kernel", backend="cpu", holdout_frac=0.0), SandboxPool(sandbox_cfg))
    yield e
    await e.aclose()


async def test_hostile_responses_score_zero_with_a_reason(env):
    task = env.tasks("train")[0]
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(env.score(task, text) for text, _ in RESPONSES.values())), timeout=120)
    for (name, (_, kind)), out in zip(RESPONSES.items(), outcomes):
        assert out.score == 0.0, name
        assert out.error_kind == kind, (name, out.error_kind, out.feedback[:200])
        assert out.feedback and len(out.feedback) < 20_000, name
    assert env.pool.stats().get("evaluations", 0) == 0  # all stopped before the sandbox


async def test_the_env_still_scores_after_them(env):
    """A clean (if rule-breaking) answer right after the junk gets its ordinary verdict."""
    task = env.tasks("train")[0]
    for text, _ in RESPONSES.values():
        await env.score(task, text)
    out = await env.score(task, block(FWD + "torch.relu(x)"))
    assert out.error_kind == "rule_violation" and "torch_compute_in_forward" in out.hacks
