import asyncio
import time

import pytest
import torch

from pipeline.engines import SamplingParams, make_engine
from pipeline.engines.hf import HFEngine
from pipeline.models import build_tiny, load_model_config

from tests.pipeline.conftest import rollout_cfg


def _prompts(tok, n):
    return [tok(f"<|im_start|>user\nkernel {i} " + "x" * (3 * i), add_special_tokens=False)["input_ids"]
            for i in range(n)]


@pytest.fixture
def engine(tiny):
    _, _, tok = tiny
    model, _ = build_tiny(load_model_config("tiny").tiny)  # own copy: tests load weights into it
    return HFEngine(model, tok, max_inflight=16, max_batch_size=8, batch_wait_s=0.01)


async def test_logprobs_match_a_teacher_forced_forward_pass(engine, tiny):
    _, _, tok = tiny
    prompts = _prompts(tok, 5)  # different lengths: left padding inside one batch
    gens = await asyncio.gather(*[engine.generate(p, SamplingParams(temperature=1.0, max_tokens=16))
                                  for p in prompts])
    assert engine.stats()["batches"] == 1
    for p, g in zip(prompts, gens):
        assert g.finish_reason in ("stop", "length") and len(g.logprobs) == len(g.token_ids) > 0
        with torch.no_grad():
            logits = engine.model(torch.tensor([p + g.token_ids], device=engine.device)).logits[0, len(p) - 1:-1]
        ref = torch.log_softmax(logits.float().cpu(), -1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-4), (ref, g.logprobs)


async def test_logprobs_are_of_logits_over_temperature(engine, tiny):
    _, _, tok = tiny
    p = _prompts(tok, 1)[0]
    g = await engine.generate(p, SamplingParams(temperature=0.5, max_tokens=6))
    with torch.no_grad():
        logits = engine.model(torch.tensor([p + g.token_ids], device=engine.device)).logits[0, len(p) - 1:-1]
    ref = torch.log_softmax(logits.float().cpu() / 0.5, -1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
    assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-4)


async def test_finish_reasons_stop_and_length(engine, tiny):
    _, _, tok = tiny
    p = _prompts(tok, 1)[0]
    every_token = list(range(engine.model.config.vocab_size))
    stopped = await engine.generate(p, SamplingParams(max_tokens=8, stop_token_ids=every_token))
    assert stopped.finish_reason == "stop" and len(stopped.token_ids) == 1
    cut = await engine.generate(p, SamplingParams(max_tokens=5))
    if tok.eos_token_id in cut.token_ids:  # a random model may emit EOS: then it stopped there
        assert cut.finish_reason == "stop" and cut.token_ids[-1] == tok.eos_token_id
    else:
        assert cut.finish_reason == "length" and len(cut.token_ids) == 5


async def test_concurrent_callers_are_batched_and_the_loop_stays_free(engine, tiny):
    _, _, tok = tiny
    ticks = []

    async def ticker():
        while True:
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.01)

    t = asyncio.create_task(ticker())
    gens = await asyncio.gather(*[engine.generate(p, SamplingParams(max_tokens=24))
                                  for p in _prompts(tok, 12)])
    t.cancel()
    s = engine.stats()
    assert len(gens) == 12 and s["requests"] == 12 and s["mean_batch_size"] > 2
    assert max(b - a for a, b in zip(ticks, ticks[1:])) < 0.25  # generation ran off the event loop


async def test_load_weights_changes_outputs_and_restores_them(engine, tiny):
    _, _, tok = tiny
    prompts = _prompts(tok, 3)
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    before = [g.token_ids for g in await asyncio.gather(*[engine.generate(p, greedy) for p in prompts])]
    original = {k: v.detach().cpu().clone() for k, v in engine.model.state_dict().items()}
    other, _ = build_tiny(load_model_config("tiny", ["tiny.seed=7"]).tiny)
    engine.load_weights(other.state_dict().items(), version=3)
    after = await asyncio.gather(*[engine.generate(p, greedy) for p in prompts])
    assert [g.token_ids for g in after] != before and {g.version for g in after} == {3}
    engine.load_weights(original.items(), version=4)
    again = [g.token_ids for g in await asyncio.gather(*[engine.generate(p, greedy) for p in prompts])]
    assert again == before and engine.version == 4
    with pytest.raises(KeyError, match="model.no_such.weight"):
        engine.load_weights([("model.no_such.weight", torch.zeros(1))], version=5)


async def test_engine_errors_become_error_generations_and_it_recovers(engine, tiny):
    _, _, tok = tiny
    bad = await engine.generate([10**6], SamplingParams(max_tokens=4))  # id beyond the vocabulary
    assert bad.finish_reason == "error" and "outside the vocabulary (size 512)" in bad.error
    engine.sleep()
    asleep = await engine.generate(_prompts(tok, 1)[0], SamplingParams(max_tokens=4))
    assert asleep.finish_reason == "error" and "EngineAsleep" in asleep.error
    engine.wake()
    ok = await engine.generate(_prompts(tok, 1)[0], SamplingParams(max_tokens=4))
    assert ok.finish_reason in ("stop", "length") and ok.token_ids


def test_make_engine_from_config(tiny):
    _, model, tok = tiny
    eng = make_engine(rollout_cfg(**{"engine.max_inflight": 3}).engine, model, tok)
    assert isinstance(eng, HFEngine) and eng.max_inflight == 3
    bad = rollout_cfg()
    bad.engine.type = "sglang"
    with pytest.raises(ValueError, match=r"rollout.engine.type='sglang'"):
        make_engine(bad.engine, model, tok)


async def test_a_bad_request_fails_alone_in_its_batch(engine, tiny):
    _, _, tok = tiny
    good = _prompts(tok, 2)
    gens = await asyncio.gather(engine.generate(good[0], SamplingParams(max_tokens=4)),
                                engine.generate([10**6], SamplingParams(max_tokens=4)),
                                engine.generate(good[1], SamplingParams(max_tokens=4)))
    assert [g.finish_reason == "error" for g in gens] == [False, True, False]


async def test_load_weights_accepts_tied_embedding_names(tiny):
    _, _, tok = tiny
    arch = load_model_config("tiny", ["tiny.tie_word_embeddings=true"]).tiny
    model, _ = build_tiny(arch)
    eng = HFEngine(model, tok, max_inflight=4, max_batch_size=4, batch_wait_s=0.01)
    other, _ = build_tiny(load_model_config("tiny", ["tiny.tie_word_embeddings=true", "tiny.seed=7"]).tiny)
    exported = dict(other.state_dict())  # what a trainer exports: lm_head.weight included
    assert "lm_head.weight" in exported
    eng.load_weights(exported.items(), version=1)
    assert torch.equal(model.lm_head.weight, other.lm_head.weight)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


async def test_unseeded_sampling_differs_between_calls(engine, tiny):
    _, _, tok = tiny
    prompt = _prompts(tok, 1)[0]
    params = SamplingParams(temperature=1.0, max_tokens=12)
    a = await engine.generate(prompt, params)
    b = await engine.generate(prompt, params)
    assert a.token_ids != b.token_ids  # 12 tokens from a ~flat 512-way distribution
    seeded = SamplingParams(temperature=1.0, max_tokens=12, seed=5)
    assert (await engine.generate(prompt, seeded)).token_ids == (await engine.generate(prompt, seeded)).token_ids


async def test_a_full_batch_starts_without_waiting_for_more(tiny):
    _, _, tok = tiny
    model, _ = build_tiny(load_model_config("tiny").tiny)
    engine = HFEngine(model, tok, max_inflight=16, max_batch_size=2, batch_wait_s=30.0)
    params = SamplingParams(temperature=1.0, max_tokens=4)
    t0 = time.monotonic()
    gens = await asyncio.wait_for(asyncio.gather(*[engine.generate(p, params) for p in _prompts(tok, 2)]),
                                  timeout=20.0)
    assert len(gens) == 2 and time.monotonic() - t0 < 20.0
    assert engine.stats()["batches"] == 1
    await engine.aclose()
