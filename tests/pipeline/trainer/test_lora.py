"""trainer.lora on CPU (tiny Qwen2, FSDP2 on gloo): only peft's adapters train; every transport
pushes W + scale * B @ A under the base names, equal to peft's own merge_and_unload; an HF
sampler behind Ray ends up with exactly those weights; a checkpoint resumes the adapters and the
optimiser exactly; bad keys stop the run in the invalid-configuration block."""
import dataclasses
import shutil

import pytest
import torch

from pipeline.algorithms import AlgorithmConfig, build_train_batch
from pipeline.models import ModelConfig, load_model_and_tokenizer
from pipeline.trainer import TrainerConfig, TrainerWorker
from pipeline.trainer import lora
from pipeline.trainer.worker import free_port
from tests.pipeline.conftest import group
from tests.pipeline.trainer.test_trainer import MAX_RESPONSE, make_samples, one_rank_step

RANK = 4


def configs(**trainer_overrides):
    model = group(ModelConfig, "model/tiny")
    trainer = group(TrainerConfig, "trainer/fsdp2", **{"optim.lr": 1e-2, "optim.warmup_ratio": 0.0,
                                                       "lora.rank": RANK, "lora.alpha": 8,
                                                       **trainer_overrides})
    algo = group(AlgorithmConfig, "algorithm/grpo_plus", **{"ppo_mini_batches": 2, "micro_batch_tokens": 40})
    return model, trainer, algo


def worker_of(model_cfg, trainer_cfg, algo_cfg, resume_dir=None):
    w = TrainerWorker(0, 1, model_cfg, trainer_cfg, algo_cfg, MAX_RESPONSE, temperature=1.0, total_optim_steps=4)
    info = w.init("127.0.0.1", free_port(), resume_dir)
    return w, info


def step(w, plan, shard):
    return w.train_step(shard, plan.ranks[0], plan.global_seqs, plan.global_tokens, MAX_RESPONSE)


def clone(sd):
    return {k: v.detach().clone() for k, v in sd.items()}


def peft_merged(model_cfg, trainer_cfg, trained: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's own answer: the same adapters on a fresh base, merge_and_unload."""
    from peft import get_peft_model

    base, _ = load_model_and_tokenizer(model_cfg)
    peft_model = get_peft_model(base, lora.peft_config(trainer_cfg.lora))
    peft_model.load_state_dict({"base_model.model." + k: v for k, v in trained.items()}, strict=True)
    return clone(peft_model.merge_and_unload().state_dict())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One LoRA worker: initial state, a step, what each transport packs, a checkpoint, then a
    second step (what a resumed worker must reproduce)."""
    model_cfg, trainer_cfg, algo_cfg = configs()
    _, tok = load_model_and_tokenizer(model_cfg)
    batch = build_train_batch(make_samples(len(tok), seed=7), algo_cfg, MAX_RESPONSE, tok.pad_token_id)
    plan, shard = one_rank_step(batch, algo_cfg)
    ckpt = str(tmp_path_factory.mktemp("lora_ckpt"))
    w, info = worker_of(model_cfg, trainer_cfg, algo_cfg)
    try:
        out = {"info": info, "plan": plan, "shard": shard, "ckpt": ckpt, "initial": clone(w.full_state_dict())}
        out["optimized"] = [p for g in w.optimizer.param_groups for p in g["params"]]
        out["adapter_params"] = [p for n, p in w.model.named_parameters() if lora.is_adapter(n)]
        out["metrics"] = step(w, plan, shard)
        out["trained"] = clone(w.full_state_dict())
        out["exported"] = clone(w.exported_state_dict())
        ipc = w.weight_sender("cuda_ipc")
        ipc.pack(1)
        out["cuda_ipc"] = {n: v.clone() for layout, flat in zip(ipc.layouts, ipc.flats) for n, v in layout.views(flat)}
        sent = w.weight_sender_call("broadcast", "prepare", 1, False)
        out["broadcast"] = {n: v.clone() for layout, flat in zip(sent.buffers, w.weight_sender("broadcast").flats)
                            for n, v in layout.views(flat)}
        out["payload_bytes"] = w.weight_payload_bytes()
        out["optim_state"] = {id(p): clone(s) for p, s in w.optimizer.state.items()}
        w.save(ckpt)
        step(w, plan, shard)
        out["second"] = clone(w.full_state_dict())
    finally:
        w.shutdown()
    return out


def test_only_the_adapters_train(run):
    initial, trained = run["initial"], run["trained"]
    adapters = [k for k in trained if lora.is_adapter(k)]
    # all-linear: q, k, v, o, gate, up, down of both layers, an A and a B each; lm_head left out
    assert len(adapters) == 2 * 7 * 2 and not any(k.startswith("lm_head.lora") for k in adapters)
    n_adapter = sum(trained[k].numel() for k in adapters)
    assert run["info"]["trainable_params"] == n_adapter < run["info"]["params"] / 10
    # the optimiser holds the adapters and nothing else
    assert {id(p) for p in run["optimized"]} == {id(p) for p in run["adapter_params"]}
    assert run["metrics"]["actor/grad_norm"] > 0
    for k in trained:
        if lora.is_adapter(k):
            assert not torch.equal(trained[k], initial[k]), k  # B starts at zero: both must move
        else:
            assert torch.equal(trained[k], initial[k]), k      # the base is frozen


def test_pushed_weights_are_peft_merge_and_unload_under_base_names(run):
    model_cfg, trainer_cfg, _ = configs()
    want = peft_merged(model_cfg, trainer_cfg, run["trained"])
    exported = run["exported"]
    assert list(exported) == list(want)  # the base model's names, in its order, nothing else
    for name, t in exported.items():
        torch.testing.assert_close(t, want[name], rtol=1e-5, atol=1e-6)
    # the merge is not a no-op: the wrapped weights moved off the base, the others did not
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (exported[q] - run["initial"]["model.layers.0.self_attn.q_proj.base_layer.weight"]).abs().max() > 1e-4
    assert torch.equal(exported["lm_head.weight"], run["initial"]["lm_head.weight"])
    # cuda_ipc's buffers and broadcast's flats carry the same tensors (fp32 export on CPU)
    for transport in ("cuda_ipc", "broadcast"):
        assert set(run[transport]) == set(exported), transport
        for name, t in run[transport].items():
            assert torch.equal(t, exported[name]), (transport, name)
    assert run["payload_bytes"] == sum(t.numel() * t.element_size() for t in exported.values())


def test_checkpoint_holds_the_merged_policy_and_a_peft_adapter_and_resumes_exactly(run):
    from peft import PeftModel
    from safetensors.torch import load_file

    model_cfg, trainer_cfg, algo_cfg = configs()
    ckpt = run["ckpt"]
    # model/: the merged policy, as any HF reader (evaluation, vLLM) loads it
    hf, _ = load_model_and_tokenizer(dataclasses.replace(model_cfg, path=f"{ckpt}/model"))
    for name, t in hf.state_dict().items():
        torch.testing.assert_close(t, run["exported"][name], rtol=0, atol=0)
    # adapter/: peft's format, onto the base from model.path
    base, _ = load_model_and_tokenizer(model_cfg)
    merged = PeftModel.from_pretrained(base, f"{ckpt}/{lora.ADAPTER_DIR}").merge_and_unload().state_dict()
    for name, t in merged.items():
        torch.testing.assert_close(t, run["exported"][name], rtol=1e-5, atol=1e-6)
    assert all(".lora_" in k for k in load_file(f"{ckpt}/{lora.ADAPTER_DIR}/adapter_model.safetensors"))
    # resume: the adapters and the optimiser state come back, and the next step is the same step
    w, _ = worker_of(model_cfg, trainer_cfg, algo_cfg, resume_dir=ckpt)
    try:
        resumed = w.full_state_dict()
        assert set(resumed) == set(run["trained"])
        for k, t in resumed.items():
            assert torch.equal(t, run["trained"][k]), k
        states = sorted((s["exp_avg_sq"].sum().item() for s in w.optimizer.state.values()))
        assert states == sorted(s["exp_avg_sq"].sum().item() for s in run["optim_state"].values())
        step(w, run["plan"], run["shard"])
        for k, t in w.full_state_dict().items():
            torch.testing.assert_close(t, run["second"][k], rtol=1e-5, atol=1e-7)
    finally:
        w.shutdown()
    # the adapter must fit trainer.lora: other targets or another rank are named, not loaded
    for other, named in (({"target_modules": ["q_proj"]}, "unknown"), ({"rank": 2 * RANK}, "other shape")):
        fresh = lora.apply(load_model_and_tokenizer(model_cfg)[0], dataclasses.replace(trainer_cfg.lora, **other))
        with pytest.raises(ValueError, match=f"does not fit trainer.lora.*{named} \\['base_model"):
            lora.load_adapter(fresh, f"{ckpt}/{lora.ADAPTER_DIR}")


def test_a_lora_step_under_ray_reaches_an_hf_sampler_merged(ray_local):
    """TrainerGroup (a Ray actor) trains with LoRA, the object store pushes to two HF samplers
    with verification (each engine's tensors checksummed against what was sent), and the
    samplers then generate with the log-probs of peft's merged model."""
    import asyncio

    from pipeline.resources import create_resource_pools
    from pipeline.resources_config import ResourcesConfig
    from pipeline.rollout_config import load_rollout_config
    from pipeline.sampler import SamplerGroup
    from pipeline.trainer import TrainerGroup
    from pipeline.weight_push import make_weight_push
    from rewards.interface import TaskRef
    from tests.pipeline.weight_push.test_weight_push import generate, max_gap

    model_cfg, trainer_cfg, algo_cfg = configs()
    base, tok = load_model_and_tokenizer(model_cfg)
    batch = build_train_batch(make_samples(len(tok), seed=8), algo_cfg, MAX_RESPONSE, tok.pad_token_id)
    rollout = load_rollout_config("hf", ["n_trajectories=2", "turns=1", "max_response_length=8",
                                         "temperature=1.0", "response_length_schedule=[]"])
    pools = create_resource_pools(group(ResourcesConfig, "resources/default", **{"sampler.cpu_workers": 2}))
    samplers = SamplerGroup(model_cfg, rollout, {"_target_": "rewards.toy.ToyEnv"}, resource_pool=pools.sampler)
    trainer = TrainerGroup(pools.trainer, model_cfg, trainer_cfg, algo_cfg, MAX_RESPONSE,
                           temperature=1.0, total_optim_steps=4)
    tasks = [TaskRef("toy/a", {"prompt": "say a"}), TaskRef("toy/b", {"prompt": "say b"})]
    try:
        assert trainer.info["trainable_params"] < trainer.info["params"] / 10
        assert trainer.train(batch, MAX_RESPONSE)["actor/grad_norm"] > 0
        merged_sd = peft_merged(model_cfg, trainer_cfg, trainer.full_state_dict())
        policy, _ = load_model_and_tokenizer(model_cfg)
        policy.load_state_dict(merged_sd)
        sync = make_weight_push(trainer, samplers, "object_store", timeout_s=120, verify=True)
        asyncio.run(sync.push(1))  # raises if any engine's tensor differs from what was sent
        assert sync.last_stats["checked_tensors"] == len(base.state_dict())
        after = asyncio.run(generate(samplers, 1, tasks))
        assert {s.policy_version for s in after} == {1} and len({s.task_id for s in after}) == 2
        assert max_gap(policy, after) < 1e-4   # the samplers hold the merged policy ...
        assert max_gap(base, after) > 1e-3     # ... which is not the base any more
    finally:
        samplers.shutdown()
        trainer.shutdown()
        pools.remove()


def test_bad_lora_keys_are_named_before_ray(tmp_path):
    from pipeline.config import ConfigError, preflight
    from tests.pipeline.test_day_one import cli, compose_cfg, env, one_block

    with pytest.raises(ConfigError) as e:
        preflight(compose_cfg("+experiment=toy", "trainer.lora.rank=8", "trainer.lora.alpha=0",
                              "trainer.lora.target_modules=[q_proj,qproj,embed_tokens,lm_head]"))
    text = str(e.value)
    assert text.startswith("invalid configuration:")
    assert "trainer.lora.alpha=0.0: expected > 0" in text
    assert "'qproj' matches no module in the model" in text and "'q_proj' matches" not in text
    assert "'embed_tokens' matches no linear layer (only ['Embedding'])" in text
    assert "wraps the output layer" in text and "('lm_head' matches 'lm_head')" in text
    assert "'lm_head'," not in text  # not offered among the layers to adapt
    assert preflight(compose_cfg("+experiment=toy", "trainer.lora.rank=8")).trainer.lora.rank == 8
    err = one_block(cli("pipeline.main", "+experiment=toy", "trainer.lora.rank=-1", cwd=tmp_path,
                        environ=env(tmp_path)))
    assert "trainer.lora.rank=-1: expected >= 0" in err


def test_two_fsdp2_ranks_train_and_push_like_one(ray_local, tmp_path):
    """Two ranks (rank 1 a meta-device skeleton that receives the base and the adapters from rank
    0 by broadcast) take the one-rank step, and their object-store push, gathered from the shards,
    is peft's merge of the trained adapters."""
    import asyncio

    import ray

    from tests.pipeline.conftest import save_tiny_checkpoint
    from tests.pipeline.trainer.test_trainer import run_step

    model_cfg, trainer_cfg, algo_cfg = configs()
    hf_cfg = dataclasses.replace(model_cfg, path=save_tiny_checkpoint(str(tmp_path / "tiny_hf"), model_cfg.tiny))
    _, tok = load_model_and_tokenizer(model_cfg)
    batch = build_train_batch(make_samples(len(tok), seed=9), algo_cfg, MAX_RESPONSE, tok.pad_token_id)
    pushed = {}

    def push(trainer):
        payload = ray.get(trainer.weight_sender_call("object_store", "send", 1, False))[0]
        pushed.update(pair for ref in payload.buckets for pair in ray.get(ref))

    m1, w1 = run_step(ray_local, (model_cfg, trainer_cfg, algo_cfg), 1, batch)
    m2, w2 = run_step(ray_local, (model_cfg, trainer_cfg, algo_cfg), 2, batch, model_cfg=hf_cfg, after=push)
    assert m2["actor/grad_norm"] == pytest.approx(m1["actor/grad_norm"], rel=1e-4) and m1["actor/grad_norm"] > 0
    assert set(w1) == set(w2)
    # Adam moves each adapter weight by up to lr (1e-2) whatever its gradient's size, so the
    # reduction-order noise of a near-zero gradient shows at 1e-5: 2e-4 is 2 % of one step's move
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=2e-4)
    want = peft_merged(model_cfg, trainer_cfg, w2)
    assert list(pushed) == list(want)
    for name, t in pushed.items():
        torch.testing.assert_close(t, want[name], rtol=1e-5, atol=1e-6)


def test_gpu_defaults_train_lora_like_the_plain_forward():
    """The GPU run's forward (packed rows, the chunked log-prob head, activation checkpointing)
    takes the same LoRA step as padded rows through the full logits, and still trains only the
    adapters."""
    model_cfg, trainer_cfg, algo_cfg = configs()
    _, tok = load_model_and_tokenizer(model_cfg)
    batch = build_train_batch(make_samples(len(tok), seed=10), algo_cfg, MAX_RESPONSE, tok.pad_token_id)
    plan, shard = one_rank_step(batch, algo_cfg)
    results = []
    for levers in ({"logprob_chunk_tokens": 0, "remove_padding": "false"},
                   {"logprob_chunk_tokens": 2, "remove_padding": "true", "gradient_checkpointing": True}):
        w, _ = worker_of(model_cfg, dataclasses.replace(trainer_cfg, **levers), algo_cfg)
        try:
            initial = clone(w.full_state_dict())
            results.append((step(w, plan, shard), clone(w.full_state_dict()), initial))
        finally:
            w.shutdown()
    (m_plain, w_plain, _), (m_gpu, w_gpu, initial) = results
    assert m_plain["actor/grad_norm"] > 0
    assert m_gpu["actor/grad_norm"] == pytest.approx(m_plain["actor/grad_norm"], rel=1e-4)
    for k, t in w_gpu.items():
        torch.testing.assert_close(t, w_plain[k], rtol=1e-4, atol=2e-5)
        assert torch.equal(t, initial[k]) != lora.is_adapter(k), k


@pytest.mark.slow
def test_a_lora_run_checkpoints_and_resumes_through_the_pipeline(ray_local, tmp_path):
    """The toy experiment end to end with LoRA (verified pushes to the HF samplers every step):
    each checkpoint holds the merged policy and the adapter; a run resumed from step 0's
    checkpoint loses and repeats nothing and trains step 1 on the very same batch."""
    from safetensors.torch import load_file

    from pipeline.main import run as run_pipeline
    from tests.pipeline.test_e2e import TOY, config, metrics_lines

    args = [*TOY, "pipeline.mode=one_off", "pipeline.steps=3", "checkpoint.every=1",
            "trainer.lora.rank=4", "trainer.optim.lr=1e-3"]
    run_pipeline(config(*args), tmp_path)
    original = metrics_lines(tmp_path)
    ckpts = tmp_path / "checkpoints"
    base = load_file(str(ckpts / "step_000000" / "model" / "model.safetensors"))
    last = load_file(str(ckpts / "step_000002" / "model" / "model.safetensors"))
    assert not any(".lora_" in k or "base_layer" in k for k in last)  # base names only
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(base[q], last[q])  # the merged policy moved between checkpoints
    assert torch.equal(base["model.embed_tokens.weight"], last["model.embed_tokens.weight"])  # not adapted
    assert (ckpts / "step_000002" / lora.ADAPTER_DIR / "adapter_config.json").exists()
    for name in ("step_000001", "step_000002"):
        shutil.rmtree(ckpts / name)
    run_pipeline(config(*args, "resume=auto"), tmp_path)
    resumed = metrics_lines(tmp_path)
    assert [m["step"] for m in resumed] == [0, 1, 2]
    assert resumed[1]["critic/score/mean"] == original[1]["critic/score/mean"]
    assert resumed[1]["actor/optim_steps"] == original[1]["actor/optim_steps"]
    # step 1 trains the same batch from the same restored adapters and optimiser: the same step
    assert resumed[1]["actor/loss"] == pytest.approx(original[1]["actor/loss"], rel=1e-5, abs=1e-7)


def test_a_carried_checkpoint_resumes_the_adapters_with_fresh_moments(run, tmp_path):
    """bench.ckpt_carry: the newest checkpoint in small parts and back; the resumed worker has the
    adapters (rounded to bfloat16), the schedule's step, and Adam's moments from zero."""
    import pickle

    from bench import ckpt_carry

    model_cfg, trainer_cfg, algo_cfg = configs()
    src = tmp_path / "run"
    for n in (1, 3):  # the newest travels
        shutil.copytree(run["ckpt"], src / "checkpoints" / f"step_{n:06d}")
        (src / "checkpoints" / f"step_{n:06d}" / "loop.pt").write_bytes(pickle.dumps({"step": n, "pending": None}))
    (src / "metrics.jsonl").write_text('{"step": 0}\n')
    parts = ckpt_carry.pack(src, tmp_path / "out", part_mib=0.01)
    assert len(parts) > 2 and all(p.stat().st_size <= int(0.01 * 2**20) for p in parts)
    ckpt = ckpt_carry.unpack(tmp_path / "out", tmp_path / "next")
    assert ckpt == tmp_path / "next" / "checkpoints" / "step_000003"
    assert sorted(p.name for p in ckpt.iterdir()) == ["adapter", "loop.pt", "optimizer.pt"]
    assert (tmp_path / "next" / "metrics.jsonl").read_text() == '{"step": 0}\n'
    w, _ = worker_of(model_cfg, trainer_cfg, algo_cfg, resume_dir=str(ckpt))
    try:
        resumed = w.full_state_dict()
        for k, t in run["trained"].items():
            if lora.is_adapter(k):
                assert not torch.equal(resumed[k], run["initial"][k]), k
                torch.testing.assert_close(resumed[k], t.to(torch.bfloat16).float(), rtol=0, atol=0)
            else:
                assert torch.equal(resumed[k], t), k
        assert w.optim_steps == 2 and not w.optimizer.state  # the schedule's place, no moments
        assert torch.isfinite(torch.tensor(step(w, run["plan"], run["shard"])["actor/loss"]))
    finally:
        w.shutdown()
    # a part missing, or a full-model checkpoint, is named
    parts[1].unlink()
    with pytest.raises(SystemExit, match="one is missing"):
        ckpt_carry.unpack(tmp_path / "out", tmp_path / "again")
    shutil.rmtree(src / "checkpoints" / "step_000003" / lora.ADAPTER_DIR)
    with pytest.raises(SystemExit, match="holds no adapter/.*only a LoRA run"):
        ckpt_carry.pack(src, tmp_path / "out2")
