import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rewards.config import load_reward_config
from rewards.env import KernelEnv
from rewards.interface import Turn
from rewards.parse import parse_response
from rewards.prompts import build_messages, render

# ChatML, as Qwen models use it; it does not strip <think> by itself
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    raw = Tokenizer(models.WordLevel({"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", chat_template=CHATML)


@pytest.fixture(scope="module")
def env():
    return KernelEnv(load_reward_config("kernel"), eval_pool=None)


def test_turn_one_has_system_and_task(env):
    task = env.tasks("train")[0]
    msgs = env.messages(task, [])
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "C++" in msgs[0]["content"] and "load_inline" in msgs[0]["content"]
    assert "ModelNew" in msgs[0]["content"] and "```python" in msgs[0]["content"]
    assert env.task(task).source.strip() in msgs[1]["content"]
    assert "class Model(nn.Module)" in msgs[1]["content"]


def test_prompt_lists_enabled_rules_only():
    cfg = load_reward_config("kernel", **{"rules.enabled": ["no_kernel"]})
    system = build_messages("src", "triton", cfg.rules.enabled, [])[0]["content"]
    assert "@triton.jit" in system and "try/except" not in system


def test_turn_two_keeps_summary_code_feedback_and_drops_reasoning(env, tokenizer):
    task = env.tasks("train")[0]
    response = ("<think>SECRET-CHAIN-OF-THOUGHT about tiling</think>\nI tiled the loop over rows.\n"
                "```python\nclass ModelNew:\n    pass\n```")
    parsed = parse_response(response)
    turn = Turn(summary=parsed.summary, answer=parsed.code, feedback="FEEDBACK-1: output 0 is wrong")
    msgs = env.messages(task, [turn])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    text = render(tokenizer, msgs)
    assert "I tiled the loop over rows." in text and "class ModelNew" in text and "FEEDBACK-1" in text
    assert "SECRET-CHAIN-OF-THOUGHT" not in text and "<think>" not in text
    assert "Improve your answer" in msgs[-1]["content"]
    # the chat template was used: role markers and the generation prompt are there
    assert text.count("<|im_start|>") == 5 and text.endswith("<|im_start|>assistant\n")
    # later turns extend the earlier prompt (prefix caching)
    first = render(tokenizer, env.messages(task, []))
    assert text.startswith(first.removesuffix("<|im_start|>assistant\n"))


def test_render_strips_reasoning_left_in_assistant_messages(tokenizer):
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>hidden</think>kept"},
            {"role": "user", "content": "again"}]
    text = render(tokenizer, msgs)
    assert "hidden" not in text and "kept" in text


def test_render_without_chat_template_names_the_problem(tokenizer):
    plain = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, unk_token="[UNK]")
    with pytest.raises(ValueError, match="chat_template"):
        render(plain, [{"role": "user", "content": "q"}])
