"""pipeline.sft: conversations (corpus, JSONL with errors that name the line), the row layout, and
the SFT step of the real FSDP2 trainer worker (one gloo rank, in-process)."""
import dataclasses
import json
from collections import Counter

import pytest
import torch

from pipeline.algorithms import AlgorithmConfig
from pipeline.models import ModelConfig, load_model_and_tokenizer
from pipeline.sft_data import (DataError, corpus_conversations, jsonl_conversations, sft_batch,
                               tokenize)
from pipeline.trainer import TrainerConfig, plan_step
from rewards.config import load_reward_config
from rewards.env import KernelEnv
from rewards.parse import parse_response
from rewards.prompts import render
from tests.pipeline.conftest import group


@pytest.fixture(scope="module")
def env():
    return KernelEnv(load_reward_config("kernel"), eval_pool=None)


def test_corpus_answers_parse_as_the_env_parses_them():
    convs = corpus_conversations("cpu")
    assert convs
    for c in convs:
        parsed = parse_response(c.response)
        assert parsed.ok, (c.label, parsed.error)
        assert parsed.summary and "class ModelNew" in parsed.code


def test_variant_weights_repeat_a_variant_and_zero_drops_it():
    labels = Counter(c.label.rsplit(":", 1)[1]
                     for c in corpus_conversations("cpu", ["L1/19_silu"], weights={"wrong": 3, "fast": 0}))
    assert labels == {"slow": 1, "wrong": 3, "broken": 1}


def test_jsonl_errors_name_the_file_line_and_field(tmp_path, env):
    known = {t.task_id for t in env.tasks("train")}
    good = json.dumps({"task": "L1/17_relu", "response": "Summary.\n\n```python\nx = 1\n```"})
    cases = {
        "not json": ("{oops", "not JSON"),
        "missing": (json.dumps({"task": "L1/17_relu"}), "field 'response'"),
        "empty task": (json.dumps({"task": "", "response": "x"}), "field 'task'"),
        "unknown": (json.dumps({"task": "L9/nope", "response": "x"}), "'L9/nope' is not a task"),
        "list": ("[1, 2]", "expected an object"),
    }
    for name, (bad, words) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.jsonl"
        path.write_text(f"{good}\n\n{bad}\n")
        with pytest.raises(DataError) as e:
            jsonl_conversations(path, known)
        assert f"{path}:3" in str(e.value) and words in str(e.value), name
    with pytest.raises(DataError, match="no such file"):
        jsonl_conversations(tmp_path / "absent.jsonl", known)
    (tmp_path / "ok.jsonl").write_text(good + "\n")
    assert [c.task_id for c in jsonl_conversations(tmp_path / "ok.jsonl", known)] == ["L1/17_relu"]


def test_rows_hold_the_env_prompt_and_mask_only_the_answer(env):
    _, tok = load_model_and_tokenizer(group(ModelConfig, "model/tiny"))
    convs = corpus_conversations("cpu")[:3]
    rows = tokenize(convs, env, tok, 4096, 4096)
    batch = sft_batch(rows, tok.pad_token_id)
    P = batch.prompt_len
    for b, ((p, r), c) in enumerate(zip(rows, convs)):
        from rewards.interface import TaskRef

        expected = render(tok, env.messages(TaskRef(c.task_id, env.task(c.task_id)), []))
        assert tok.decode(p) == expected  # turn 1 exactly as the environment builds it
        assert r[-1] == tok.eos_token_id  # the model learns to end its turn
        assert batch.input_ids[b, P - len(p):P].tolist() == p
        assert batch.input_ids[b, P:P + len(r)].tolist() == r
        assert batch.response_mask[b].sum() == len(r)
        assert batch.attention_mask[b].sum() == len(p) + len(r)
    with pytest.raises(DataError, match="over sft.max_response_length"):
        tokenize(convs, env, tok, 4096, 8)


def test_sft_steps_lower_the_answer_loss_and_lr_zero_does_not(env):
    """The real worker (FSDP2 on one gloo rank): a few steps on the same conversations lower their
    NLL; with lr 0 (the trainer bypassed) it stays where it was."""
    from pipeline.trainer import TrainerWorker
    from pipeline.trainer.worker import BATCH_KEYS, free_port

    model_cfg = group(ModelConfig, "model/tiny")
    _, tok = load_model_and_tokenizer(model_cfg)
    rows = [(p[-48:], r[:24]) for p, r in tokenize(corpus_conversations("cpu")[:2], env, tok, 4096, 4096)]
    batch = sft_batch(rows, tok.pad_token_id)
    algo = group(AlgorithmConfig, "algorithm/grpo_plus", **{"ppo_mini_batches": 1, "grad_clip": 1.0,
                                                            "micro_batch_tokens": 64})
    lens = [int(x) for x in batch.attention_mask.sum(1)]
    plan = plan_step(lens, [int(x) for x in batch.response_mask.sum(1)], 1, 1, algo.micro_batch_tokens)
    shard = {k: getattr(batch, k)[torch.tensor(plan.ranks[0].rows)] for k in BATCH_KEYS}
    assert len(plan.ranks[0].mini_batches[0]) == 2  # two micro-batches accumulate into one step
    losses = {}
    for lr in (3e-3, 0.0):
        trainer = group(TrainerConfig, "trainer/fsdp2", **{"optim.lr": lr, "optim.warmup_ratio": 0.0})
        worker = TrainerWorker(0, 1, model_cfg, trainer, algo, batch.response_len, temperature=1.0,
                               total_optim_steps=6)
        worker.init("127.0.0.1", free_port())
        try:
            losses[lr] = [worker.sft_step(shard, plan.ranks[0], plan.global_seqs, plan.global_tokens)["sft/loss"]
                          for _ in range(6)]
        finally:
            worker.shutdown()
    assert losses[3e-3][0] == pytest.approx(losses[0.0][0], rel=1e-5)  # same start
    assert losses[3e-3][-1] < losses[3e-3][0] - 0.5, losses
    assert losses[0.0][-1] == pytest.approx(losses[0.0][0], rel=1e-5), losses


def test_warm_start_command_and_cache_key_follow_the_run():
    from hydra import compose, initialize_config_dir

    from pipeline.config import register
    from pipeline.conf_files import CONF_DIR
    from pipeline.warm_start import cache_key, sft_overrides

    register()
    cli = ["+experiment=kernel_multiturn", "model.tiny.hidden_size=96", "pipeline.steps=2"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        full = compose(config_name="config", overrides=[cli[0], "profile=full"])
        cfg = compose(config_name="config", overrides=[*cli, "profile=laptop"])
    assert full.model.warm_start is None  # a GPU run brings its own model
    assert cfg.model.warm_start == "kernel_sft"  # the laptop default (docs/sft.md)
    cmd = sft_overrides(cfg, "laptop", cli)
    assert cmd[:3] == ["+experiment=kernel_sft", "profile=laptop", "reward.backend=cpu"]
    assert "model.tiny.hidden_size=96" in cmd and "pipeline.steps=2" not in cmd
    tasks = ",".join(cfg.reward.task_ids)
    assert f"sft.task_ids=[{tasks}]" in cmd and f"reward.task_ids=[{tasks}]" in cmd
    key = cache_key(cfg, cmd)
    assert key == cache_key(cfg, list(cmd))  # deterministic
    assert key != cache_key(cfg, sft_overrides(cfg, "laptop", ["model.tiny.hidden_size=64"]))


def test_evaluate_compare_table_and_model_dirs(tmp_path):
    from pipeline.evaluate import model_dir_of, side_by_side

    (tmp_path / "ckpt" / "model").mkdir(parents=True)
    (tmp_path / "ckpt" / "model" / "config.json").write_text("{}")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert model_dir_of(str(tmp_path / "ckpt"), "evaluate.checkpoint") == tmp_path / "ckpt" / "model"
    assert model_dir_of(str(tmp_path / "hf"), "evaluate.compare") == tmp_path / "hf"
    with pytest.raises(FileNotFoundError, match="evaluate.compare="):
        model_dir_of(str(tmp_path / "nothing"), "evaluate.compare")
    table = side_by_side(["warm", "rl"], [{"eval/avg_correct": 0.25, "eval/fast_1": 0.0},
                                          {"eval/avg_correct": 0.75, "eval/fast_1": 0.5}], 8)
    rows = {line[:16].strip(): line[16:].split() for line in table.splitlines()}
    assert rows["correct rate"] == ["0.250", "0.750"] and rows["fast_1"] == ["0.000", "0.500"]
    assert set(rows) >= {"mean score", "best@k correct", "best@k speedup"}


def test_a_saved_tiny_tokenizer_splits_text_as_the_one_it_was_built_as(tmp_path):
    """A warm start is saved and reloaded from an HF directory: its tokenizer must give the ids the
    model was trained on (AutoTokenizer alone picks Qwen2Tokenizer there, which splits differently)."""
    from pipeline.models.load import load_tokenizer
    from pipeline.models.tiny import build_tiny_tokenizer
    from tests.pipeline.conftest import save_tiny_checkpoint

    directory = save_tiny_checkpoint(str(tmp_path / "tiny"))
    text = corpus_conversations("cpu")[0].response
    built = build_tiny_tokenizer(512)
    loaded = load_tokenizer(dataclasses.replace(group(ModelConfig, "model/tiny"), path=directory))
    assert loaded(text, add_special_tokens=False)["input_ids"] == built(text, add_special_tokens=False)["input_ids"]
    assert loaded.chat_template == built.chat_template and loaded.pad_token_id == built.pad_token_id
