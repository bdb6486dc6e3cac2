"""FSDP2 trainer on CPU (gloo): a real 2-process data-parallel step equals the 1-process step."""
import dataclasses
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from pipeline.algorithms import AlgorithmConfig, build_train_batch
from pipeline.models import ModelConfig, load_model_and_tokenizer
from tests.pipeline.conftest import save_tiny_checkpoint
from pipeline.resources import create_resource_pools
from pipeline.resources_config import ResourcesConfig
from pipeline.sample import Sample
from pipeline.trainer import TrainerConfig, TrainerGroup, plan_step
from tests.pipeline.conftest import group

MAX_RESPONSE = 12


def make_samples(vocab: int, n_tasks: int = 3, n_traj: int = 3, seed: int = 0) -> list[Sample]:
    """Prompts/responses of varying lengths, scores spread within each task (non-zero advantages)."""
    rng = random.Random(seed)
    out = []
    for t in range(n_tasks):
        for j in range(n_traj):
            p = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 9))]
            r = [rng.randrange(3, vocab) for _ in range(rng.randint(2, MAX_RESPONSE))]
            finish = "length" if len(r) == MAX_RESPONSE else "stop"
            out.append(Sample(uid=f"0/t{t}/{j}/0", step=0, task_id=f"t{t}", traj=j, turn=0,
                              prompt_ids=p, response_ids=r, logprobs=[-2.0] * len(r),
                              finish_reason=finish, score=float(rng.random() * 2),
                              policy_version=0))
    return out


def test_plan_fills_ranks_to_equal_micro_batch_counts():
    lengths = [5, 40, 7, 33, 12, 3, 21]
    plan = plan_step(lengths, [1] * len(lengths), world_size=2, n_mini=2, token_budget=40)
    for m in range(2):
        counts = {len(r.mini_batches[m]) for r in plan.ranks}
        assert len(counts) == 1  # every rank runs the same number of forwards
    real = sorted(row for r in plan.ranks for row, f in zip(r.rows, r.filler) if not f)
    assert real == list(range(len(lengths)))  # each row trained exactly once
    for r in plan.ranks:
        for mini in r.mini_batches:
            for micro in mini:
                if len(micro) > 1:
                    assert sum(lengths[r.rows[i]] for i in micro) <= 40


def one_rank_step(batch, algo_cfg):
    """The plan of a one-rank step over ``batch`` and the rows that rank holds."""
    from pipeline.trainer.worker import BATCH_KEYS

    lens = [int(x) for x in batch.attention_mask.sum(1)]
    plan = plan_step(lens, [int(x) for x in batch.response_mask.sum(1)], 1, algo_cfg.ppo_mini_batches,
                     algo_cfg.micro_batch_tokens)
    return plan, {k: getattr(batch, k)[torch.tensor(plan.ranks[0].rows)] for k in BATCH_KEYS}


@pytest.fixture(scope="module")
def configs():
    model = group(ModelConfig, "model/tiny")
    trainer = group(TrainerConfig, "trainer/fsdp2", **{"optim.lr": 1e-3, "optim.warmup_ratio": 0.0})
    algo = group(AlgorithmConfig, "algorithm/grpo_plus",
                 **{"ppo_mini_batches": 2, "micro_batch_tokens": 40})
    return model, trainer, algo


def run_step(ray_local, configs, world_size, batch, correction="off", model_cfg=None, after=None):
    """(metrics, full state dict) of one step; ``after(trainer)`` runs on the group before it goes."""
    tiny_cfg, trainer_cfg, algo_cfg = configs
    model_cfg = model_cfg or tiny_cfg
    algo_cfg = dataclasses.replace(algo_cfg, off_policy_correction=correction)
    res = group(ResourcesConfig, "resources/default", **{"trainer.cpu_ranks": world_size,
                                                         "sampler.cpus_per_worker": 0.01})
    pools = create_resource_pools(res)
    trainer = TrainerGroup(pools.trainer, model_cfg, trainer_cfg, algo_cfg, MAX_RESPONSE,
                           temperature=1.0, total_optim_steps=4)
    try:
        metrics = trainer.train(batch, MAX_RESPONSE)
        weights = trainer.full_state_dict()
        if after is not None:
            after(trainer)
    finally:
        trainer.shutdown()
        pools.remove()
    return metrics, weights


def teacher_forced_log_probs(model, samples):
    """What the trainer recomputes as old log-probs, written where the sampler's go."""
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1:-1]
        lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(s.response_ids)[:, None])
        s.logprobs = lp[:, 0].tolist()


def test_two_ranks_equal_one_rank_and_corrections_agree(ray_local, configs, tmp_path):
    model_cfg, _, algo_cfg = configs
    # the 2-rank run reads the same weights from an HF directory: rank 0 loads them, rank 1
    # builds a meta-device skeleton and receives them by broadcast
    hf_dir = save_tiny_checkpoint(str(tmp_path / "tiny_hf"), model_cfg.tiny)
    hf_cfg = dataclasses.replace(model_cfg, path=hf_dir)
    model, tok = load_model_and_tokenizer(model_cfg)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    samples = make_samples(len(tok))
    teacher_forced_log_probs(model, samples)
    batch = build_train_batch(samples, algo_cfg, MAX_RESPONSE, tok.pad_token_id)
    assert batch.input_ids.shape[0] >= 6
    runs = [(1, "off", None), (2, "off", hf_cfg), (1, "bypass", None), (1, "tis", None)]
    with ThreadPoolExecutor(len(runs)) as ex:  # all groups start at once: actor start-up dominates
        (m1, w1), (m2, w2), (mb, wb), (mt, wt) = ex.map(
            lambda r: run_step(ray_local, configs, r[0], batch, r[1], r[2]), runs)
    assert m1["actor/mini_batches"] == 2 and m1["actor/micro_batches"] >= 2
    assert m1["actor/loss"] == pytest.approx(m2["actor/loss"], rel=1e-4, abs=1e-6)
    assert m1["actor/grad_norm"] == pytest.approx(m2["actor/grad_norm"], rel=1e-4)
    assert m1["actor/grad_norm"] > 0
    assert set(w1) == set(w2) and "model.embed_tokens.weight" in w1  # HF names
    moved = max((w1[k] - initial[k]).abs().max().item() for k in w1)
    assert moved > 1e-4  # the step changed the weights ...
    # ... identically with one rank and with two: Adam moves each weight by up to ~lr (1e-3) per
    # step whatever the gradient's size, so reduction-order noise in a near-zero gradient shows
    # up at 1e-6; 2e-5 is 2 % of one step's move
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=1e-4, atol=2e-5)
    # the sampler's log-probs equal the recomputed ones here, so using them as the old policy
    # (bypass) or reweighting by their ratio (tis, weights 1) must train exactly like "off"
    for m in (mb, mt):
        assert m["actor/loss"] == pytest.approx(m1["actor/loss"], rel=1e-3, abs=1e-6)
        assert m["actor/grad_norm"] == pytest.approx(m1["actor/grad_norm"], rel=1e-3)


def test_chunked_packed_log_probs_train_like_padded_full_logits(configs):
    """verl's FusedLinearForPPO head (2-token chunks here, so every row spans several) on packed
    micro-batches (trainer.remove_padding, varlen attention) gives the same step as log-probs from
    the full [tokens, vocab] logits of padded rows: loss, grad norm and weights; so does the same
    head with its chunk math compiled (trainer.compile_head). (Each lever alone:
    tests/pipeline/trainer/test_packed_trainer.py, tests/pipeline/trainer/test_head.py.)"""
    from pipeline.trainer import TrainerWorker
    from pipeline.trainer.worker import free_port

    model_cfg, trainer_cfg, algo_cfg = configs
    model, tok = load_model_and_tokenizer(model_cfg)
    samples = make_samples(len(tok), seed=3)
    batch = build_train_batch(samples, algo_cfg, MAX_RESPONSE, tok.pad_token_id)
    plan, shard = one_rank_step(batch, algo_cfg)
    results = {}
    for chunk, packed, head in ((0, "false", False), (2, "true", False), (2, "true", True)):
        cfg = dataclasses.replace(trainer_cfg, logprob_chunk_tokens=chunk, remove_padding=packed, compile_head=head)
        worker = TrainerWorker(0, 1, model_cfg, cfg, algo_cfg, MAX_RESPONSE, temperature=0.7, total_optim_steps=4)
        info = worker.init("127.0.0.1", free_port())
        assert info["remove_padding"] == (packed == "true") and info["compile_head"] == head
        assert info["attn_implementation"] == ("varlen" if packed == "true" else "sdpa")
        try:
            metrics = worker.train_step(shard, plan.ranks[0], plan.global_seqs, plan.global_tokens, MAX_RESPONSE)
            results[chunk, head] = metrics, {k: v.clone() for k, v in worker.full_state_dict().items()}
        finally:
            worker.shutdown()
    m_full, w_full = results[0, False]
    assert m_full["actor/grad_norm"] > 0
    for m_chunk, w_chunk in (results[2, False], results[2, True]):
        assert m_chunk["actor/tokens"] == m_full["actor/tokens"]
        for key in ("actor/loss", "actor/grad_norm", "actor/entropy", "actor/ppo_kl"):
            if key in m_full:
                assert m_chunk[key] == pytest.approx(m_full[key], rel=1e-4, abs=1e-6), key
        for k in w_full:
            torch.testing.assert_close(w_chunk[k], w_full[k], rtol=1e-4, atol=2e-5)


def test_compiled_layers_train_like_eager_layers(configs):
    """trainer.compile_layers: each decoder layer under torch.compile, then FSDP2, gives the eager
    step (loss, grad norm, weights), and the compiled layers are what ran."""
    from pipeline.trainer import TrainerWorker
    from pipeline.trainer.worker import free_port

    model_cfg, trainer_cfg, algo_cfg = configs
    _, tok = load_model_and_tokenizer(model_cfg)
    batch = build_train_batch(make_samples(len(tok), seed=4), algo_cfg, MAX_RESPONSE, tok.pad_token_id)
    plan, shard = one_rank_step(batch, algo_cfg)
    results = {}
    for compiled in (False, True):
        worker = TrainerWorker(0, 1, model_cfg, dataclasses.replace(trainer_cfg, compile_layers=compiled),
                               algo_cfg, MAX_RESPONSE, temperature=0.7, total_optim_steps=4)
        worker.init("127.0.0.1", free_port())
        try:
            n_compiled = sum(getattr(m, "_compiled_call_impl", None) is not None for m in worker.model.modules())
            assert n_compiled == (worker.model.config.num_hidden_layers if compiled else 0)
            metrics = worker.train_step(shard, plan.ranks[0], plan.global_seqs, plan.global_tokens, MAX_RESPONSE)
            results[compiled] = metrics, {k: v.clone() for k, v in worker.full_state_dict().items()}
        finally:
            worker.shutdown()
    (m_eager, w_eager), (m_comp, w_comp) = results[False], results[True]
    assert m_eager["actor/grad_norm"] > 0
    for key in ("actor/loss", "actor/grad_norm"):
        assert m_comp[key] == pytest.approx(m_eager[key], rel=1e-4, abs=1e-6), key
    for k in w_eager:
        torch.testing.assert_close(w_comp[k], w_eager[k], rtol=1e-4, atol=2e-5)


def test_first_mini_batch_reuses_its_own_forward_as_old_log_probs(configs):
    """The first mini-batch trains on the weights its old log-probs would come from, so only the
    later mini-batches get a separate no-grad forward: every micro-batch of mini-batch 0 is run
    once, every later one twice. (That it trains like the sampler's exact log-probs is
    test_two_ranks_equal_one_rank_and_corrections_agree's bypass comparison.)"""
    from pipeline.trainer import TrainerWorker
    from pipeline.trainer.worker import free_port

    model_cfg, trainer_cfg, algo_cfg = configs
    _, tok = load_model_and_tokenizer(model_cfg)
    batch = build_train_batch(make_samples(len(tok), seed=5), algo_cfg, MAX_RESPONSE, tok.pad_token_id)
    plan, shard = one_rank_step(batch, algo_cfg)
    minis = plan.ranks[0].mini_batches
    assert len(minis) == 2
    worker = TrainerWorker(0, 1, model_cfg, trainer_cfg, algo_cfg, MAX_RESPONSE, temperature=0.7,
                           total_optim_steps=4)
    worker.init("127.0.0.1", free_port())
    forwards = []
    worker.model.register_forward_hook(lambda mod, args, kwargs, out: forwards.append(torch.is_grad_enabled()),
                                       with_kwargs=True)
    try:
        metrics = worker.train_step(shard, plan.ranks[0], plan.global_seqs, plan.global_tokens, MAX_RESPONSE)
    finally:
        worker.shutdown()
    assert forwards.count(False) == len(minis[1])  # the old pass: mini-batch 1 only
    assert forwards.count(True) == len(minis[0]) + len(minis[1])
    assert metrics["actor/grad_norm"] > 0


def test_a_rank_out_of_gpu_memory_is_reworded_with_the_settings_that_size_a_step():
    """A rank's CUDA out-of-memory, as Ray hands it to the driver (RayTaskError whose cause is
    torch.OutOfMemoryError), becomes one error naming the keys to change; other errors pass."""
    from types import SimpleNamespace

    import torch
    from ray.exceptions import RayTaskError

    from pipeline.trainer.group import out_of_memory

    algo = SimpleNamespace(micro_batch_tokens=32768)
    trainer = SimpleNamespace(gradient_checkpointing=False, logprob_chunk_tokens=1024)
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity")
    from_ray = RayTaskError("train_step", "Traceback ...", cuda).as_instanceof_cause()
    err = out_of_memory(from_ray, "train_step", algo, trainer, 1)
    text = str(err)
    assert "algorithm.micro_batch_tokens (now 32768" in text and "trainer.gradient_checkpointing=true" in text
    assert "logprob_chunk_tokens" not in text  # already chunked: not offered
    assert "CUDA said: CUDA out of memory. Tried to allocate 96.00 MiB" in text
    assert out_of_memory(cuda, "sft_step", algo, SimpleNamespace(gradient_checkpointing=True,
                                                                 logprob_chunk_tokens=0), 2) is not None
    other = RayTaskError("train_step", "Traceback ...", ValueError("bad batch")).as_instanceof_cause()
    assert out_of_memory(other, "train_step", algo, trainer, 1) is None


def test_checkpointing_a_share_of_the_layers_recomputes_only_those():
    """trainer.gradient_checkpointing_share=0.5: the first half of the decoder layers run their
    forward again in backward, the others once; gradients equal the uncheckpointed model's."""
    import torch

    from pipeline.models.tiny import build_tiny, default_tiny_arch
    from pipeline.trainer.forward import checkpoint_share, decoder_layers

    torch.manual_seed(0)
    model, _ = build_tiny(default_tiny_arch())
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (2, 16))

    def grads_and_calls() -> tuple[list[torch.Tensor], list[int]]:
        calls = [0] * len(decoder_layers(model))
        for i, layer in enumerate(decoder_layers(model)):  # the recomputation calls forward, not hooks
            def counted(*a, _forward=type(layer).forward.__get__(layer), _i=i, **k):
                calls[_i] += 1
                return _forward(*a, **k)
            layer.forward = counted
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        for layer in decoder_layers(model):
            del layer.forward
        return [p.grad.clone() for p in model.parameters()], calls

    plain, once = grads_and_calls()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    checkpoint_share(model, 0.5)
    half, calls = grads_and_calls()
    n = len(calls)
    assert once == [1] * n and n >= 2
    assert calls == [2] * ((n + 1) // 2) + [1] * (n // 2)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, half))
