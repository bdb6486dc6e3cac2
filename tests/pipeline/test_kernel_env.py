"""The tiny model through the HF engine against the real KernelEnv (cpu backend)."""
import pytest

from pipeline.engines.hf import HFEngine
from pipeline.rollout import fit_prompt, run_episodes
from rewards.interface import Turn

from tests.pipeline.conftest import rollout_cfg


@pytest.fixture(scope="module")
def kernel_env():
    from rewards.config import load_reward_config
    from rewards.env import KernelEnv
    from sandbox.config import load_default_config

    env = KernelEnv.from_config(load_reward_config("kernel", max_tasks=2), load_default_config())
    yield env
    import asyncio

    asyncio.run(env.aclose())


async def test_tiny_model_runs_multi_turn_episodes_against_kernel_env(kernel_env, tiny):
    _, model, tok = tiny
    engine = HFEngine(model, tok, max_batch_size=8)
    tasks = kernel_env.tasks("train")[:1]
    cfg = rollout_cfg(n_trajectories=2, turns=2, max_prompt_length=4000, max_response_length=12)
    batch = await run_episodes(engine, tok, kernel_env, tasks, 0, 0, cfg)
    assert len(batch.samples) == 4 and batch.stats.n_errors == 0
    for s in batch.samples:
        # random tokens are no kernel: a scored 0 with the parser's reason, never an exception
        assert s.score == 0.0 and s.outcome.parse_ok is False and s.outcome.error_kind
        assert s.outcome.feedback
    for s in (x for x in batch.samples if x.turn == 1):
        prev = next(x for x in batch.samples if x.traj == s.traj and x.turn == 0)
        text = tok.decode(s.prompt_ids)
        assert prev.outcome.feedback.splitlines()[0] in text
        assert len(s.prompt_ids) > len(prev.prompt_ids)


async def test_kernel_env_later_prompts_drop_the_reasoning(kernel_env, tiny):
    _, _, tok = tiny
    task = kernel_env.tasks("train")[0]
    response = ("<think>\nOkay, SECRET-REASONING about tiling.\n</think>\n"
                "I fused the ops into one loop.\n```python\nimport torch\n\nclass ModelNew(torch.nn.Module):\n"
                "    def forward(self, x):\n        return torch.relu(x)\n```\n")
    outcome = await kernel_env.score(task, response)  # torch compute in forward: a rule, no compile
    assert outcome.score == 0.0 and outcome.hacks
    ids, _ = fit_prompt(tok, kernel_env, task, [Turn(outcome.summary, outcome.answer, outcome.feedback)],
                        max_len=100_000)
    text = tok.decode(ids)
    assert "SECRET-REASONING" not in text and "class ModelNew" in text
    assert outcome.feedback.splitlines()[0] in text
