"""VLLMEngine on a GPU with vLLM installed (skipped elsewhere): the same contract as the HF engine."""
import asyncio

import pytest
import torch

from pipeline.engines import SamplingParams, make_engine
from pipeline.models import load_model_config, load_tokenizer
from tests.pipeline.conftest import save_tiny_checkpoint
from pipeline.rollout import run_episodes
from pipeline.rollout_config import load_rollout_config
from rewards.toy import ToyEnv

pytestmark = [pytest.mark.vllm, pytest.mark.gpu]

# head_dim 64: what vLLM's flash-attention kernels accept (the CPU tiny model has 16)
ARCH = ["tiny.hidden_size=256", "tiny.intermediate_size=512", "tiny.num_attention_heads=4",
        "tiny.num_key_value_heads=2"]
VLLM = ["engine.vllm.gpu_memory_utilization=0.25", "engine.vllm.max_model_len=2048",
        "engine.vllm.max_num_seqs=64", "engine.vllm.enforce_eager=true", "engine.vllm.dtype=bfloat16",
        "n_trajectories=4", "turns=2", "max_response_length=16", "response_length_schedule=[]",
        "max_prompt_length=1024"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    arch = load_model_config("tiny", ARCH).tiny
    path = save_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_vllm")), arch)
    other = save_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny_vllm_other")),
                                 load_model_config("tiny", ARCH + ["tiny.seed=5"]).tiny)
    tok = load_tokenizer(load_model_config("local", [f"path={path}"]))
    cfg = load_rollout_config("vllm", VLLM)
    engine = make_engine(cfg.engine, path, tok)
    yield engine, tok, path, other, cfg
    asyncio.run(engine.aclose())


def _prompts(tok, n):
    return [tok(f"<|im_start|>user\nkernel {i} " + "x" * (3 * i), add_special_tokens=False)["input_ids"]
            for i in range(n)]


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).cuda()


async def test_logprobs_match_a_teacher_forced_hf_forward(setup):
    engine, tok, path, _, _ = setup
    prompts = _prompts(tok, 8)
    gens = await asyncio.gather(*[engine.generate(p, SamplingParams(temperature=1.0, max_tokens=16))
                                  for p in prompts])
    model = _hf(path).to(torch.bfloat16)  # vLLM runs bf16: compare like with like
    diffs = []
    for p, g in zip(prompts, gens):
        assert g.finish_reason in ("stop", "length") and len(g.logprobs) == len(g.token_ids) > 0
        with torch.no_grad():
            logits = model(torch.tensor([p + g.token_ids]).cuda()).logits[0, len(p) - 1:-1].float()
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(g.token_ids).cuda()[:, None])[:, 0]
        diffs.append((ref.cpu() - torch.tensor(g.logprobs)).abs())
    d = torch.cat(diffs)
    print(f"vLLM vs HF bf16 log-prob |diff|: mean {d.mean():.2e} max {d.max():.2e}")
    assert d.mean() < 2e-2 and d.max() < 0.15


async def test_finish_reasons(setup):
    engine, tok, *_ = setup
    p = _prompts(tok, 1)[0]
    stopped = await engine.generate(p, SamplingParams(max_tokens=8, stop_token_ids=list(range(512))))
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) == 1
    cut = await engine.generate(p, SamplingParams(max_tokens=5))
    assert (cut.finish_reason, len(cut.token_ids)) == ("length", 5) or tok.eos_token_id in cut.token_ids
    bad = await engine.generate(list(range(3000)), SamplingParams(max_tokens=4))  # > max_model_len
    assert bad.finish_reason == "error" and bad.error


async def test_load_weights_changes_outputs_and_restores_them(setup):
    engine, tok, path, other, _ = setup
    from safetensors.torch import load_file

    prompts = _prompts(tok, 4)
    greedy = SamplingParams(temperature=0.0, max_tokens=12)

    async def run():
        return [g.token_ids for g in await asyncio.gather(*[engine.generate(p, greedy) for p in prompts])]

    before = await run()
    # a generator, as weight_push's receiver yields buckets: consumed on the engine thread
    engine.load_weights(((k, v) for k, v in load_file(f"{other}/model.safetensors").items()), version=1)
    after = await run()
    engine.load_weights(load_file(f"{path}/model.safetensors").items(), version=2)
    restored = await run()
    assert after != before and restored == before and engine.version == 2


async def test_a_push_mid_turn_goes_on_in_place_with_the_new_weights(setup):
    """pipeline.partial_rollout on vLLM (docs/loop.md): a push lands between two decode steps and
    the request in flight is neither restarted nor cut: its tokens before the push are those the
    old weights give alone, the ones after come from the new weights (they depart from the old
    weights' greedy run), it runs on to its own end, and it reports the version it started under."""
    engine, tok, path, other, _ = setup
    from safetensors.torch import load_file

    greedy = SamplingParams(temperature=0.0, max_tokens=600)
    # the prompt whose greedy run under the old weights is longest (a random model may stop early)
    runs = await asyncio.gather(*[engine.generate(p, greedy) for p in _prompts(tok, 6)])
    prompt, old = max(zip(_prompts(tok, 6), runs), key=lambda pr: len(pr[1].token_ids))
    assert len(old.token_ids) >= 200, [len(r.token_ids) for r in runs]
    v0 = engine.version
    task = asyncio.ensure_future(engine.generate(prompt, greedy))
    start = engine.stats()["steps"]
    while engine.stats()["steps"] < start + 40:  # 40 decode steps in: the request is mid-turn
        await asyncio.sleep(0.002)
    await asyncio.to_thread(engine.load_weights, load_file(f"{other}/model.safetensors").items(), v0 + 1)
    mixed = await task
    engine.load_weights(load_file(f"{path}/model.safetensors").items(), v0 + 2)  # the module's weights
    same = next((i for i, (a, b) in enumerate(zip(old.token_ids, mixed.token_ids)) if a != b),
                min(len(old.token_ids), len(mixed.token_ids)))
    print(f"push after {same} of {len(mixed.token_ids)} tokens (old run {len(old.token_ids)})")
    assert 30 <= same < len(mixed.token_ids), "the push did not land mid-turn"
    assert mixed.finish_reason in ("stop", "length") and mixed.version == v0
    assert len(mixed.logprobs) == len(mixed.token_ids)
    assert torch.allclose(torch.tensor(mixed.logprobs[:same]), torch.tensor(old.logprobs[:same]), atol=1e-3)


async def test_sleep_and_wake(setup):
    engine, tok, *_ = setup
    engine.sleep()
    asleep = await engine.generate(_prompts(tok, 1)[0], SamplingParams(max_tokens=4))
    assert asleep.finish_reason == "error" and "EngineAsleep" in asleep.error
    engine.wake()
    ok = await engine.generate(_prompts(tok, 1)[0], SamplingParams(max_tokens=4))
    assert ok.finish_reason in ("stop", "length") and ok.token_ids


async def test_multi_turn_episodes_on_vllm(setup):
    engine, tok, _, _, cfg = setup
    env = ToyEnv(n_tasks=2, delay_s=0.2)
    batch = await run_episodes(engine, tok, env, env.tasks("train"), 0, 0, cfg)
    assert len(batch.samples) == 2 * 4 * 2 and batch.stats.n_errors == 0
    assert min(s.t_eval_end for s in batch.samples) < max(s.t_gen_end for s in batch.samples)
    print("vLLM engine stats", engine.stats(), batch.stats.metrics())


async def test_sampler_worker_builds_vllm_from_the_tiny_config(setup):
    """SamplerWorker in-process (no Ray here): tiny model -> temporary HF dir -> vLLM -> samples."""
    from pipeline.engines.vllm import VLLMEngine
    from pipeline.rollout import BatchStats
    from pipeline.sampler_worker import SamplerWorker

    *_, cfg = setup
    cfg = load_rollout_config("vllm", VLLM + ["engine.vllm.enable_sleep_mode=false"])  # one
    # sleep-mode (CuMem) engine per process: the module's engine has it
    worker = SamplerWorker(load_model_config("tiny", ARCH), cfg,
                           {"_target_": "rewards.toy.ToyEnv", "n_tasks": 1}, gpu_memory_fraction=0.2)
    assert isinstance(worker.engine, VLLMEngine)
    items = [x async for x in worker.generate(3, worker.tasks("train"), 0)]
    samples, stats = [s for chunk in items[:-1] for s in chunk], items[-1]
    assert isinstance(stats, BatchStats) and stats.n_samples == len(samples) == 4 * 2
    assert all(s.step == 3 and s.error is None and s.logprobs for s in samples)
    await worker.aclose()
