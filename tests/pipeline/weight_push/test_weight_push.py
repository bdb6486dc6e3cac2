"""Trainer -> samplers weight push through real Ray actors: object store, then a gloo broadcast
group. After a push, the samplers' log-probs are those of the trainer's weights, and every
engine's checksums matched the sender's. The flat-buffer packing that cuda_ipc and broadcast
share, cuda_ipc's persistent buffers and the checksum comparison, without a GPU."""
import asyncio

import pytest
import torch

from pipeline.models import ModelConfig, load_model_and_tokenizer
from pipeline.resources import create_resource_pools
from pipeline.resources_config import ResourcesConfig
from pipeline.rollout_config import load_rollout_config
from pipeline.sampler import SamplerGroup
from pipeline.trainer import TrainerConfig, TrainerGroup, TrainerWorker
from pipeline.trainer.worker import free_port
from pipeline.weight_push import (checksums, choose_transport, flat_layouts, make_weight_push, pack,
                                  without_aliases)
from rewards.interface import TaskRef
from pipeline.weight_push.broadcast import BroadcastWeights
from tests.pipeline.conftest import group
from tests.reliability.test_sampler_faults import _hold_once, _kill_when_held

TEMPERATURE = 1.0


def teacher_forced(model, s):
    ids = torch.tensor([s.prompt_ids + s.response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1:-1].float() / TEMPERATURE
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
    return lp


def max_gap(model, samples):
    return max((teacher_forced(model, s) - torch.tensor(s.logprobs)).abs().max().item()
               for s in samples if s.response_ids)


async def generate(pool, version, tasks):
    return [s async for s in pool.generate(version, tasks, version)]


class HeldBroadcast(BroadcastWeights):
    """A broadcast payload whose first receiver stops inside the push, before any buffer."""

    def __init__(self, inner: BroadcastWeights, marker: str) -> None:
        super().__init__(inner.version, inner.buffers, inner.checksums, inner.timings)
        self.marker = marker

    def tensors(self, state):
        _hold_once(self.marker)
        yield from super().tensors(state)


async def _push_and_kill(sync, version, marker):
    push = asyncio.ensure_future(sync.push(version))
    killed = await _kill_when_held(marker)
    await asyncio.wait_for(push, 300)
    return killed


def test_push_reaches_every_sampler(ray_local, tmp_path):
    base = group(ModelConfig, "model/tiny")
    other = group(ModelConfig, "model/tiny", **{"tiny.seed": 1})
    rollout = load_rollout_config("hf", ["n_trajectories=2", "turns=1", "max_response_length=8",
                                         f"temperature={TEMPERATURE}", "response_length_schedule=[]"])
    pools = create_resource_pools(group(ResourcesConfig, "resources/default", **{"sampler.cpu_workers": 2}))
    samplers = SamplerGroup(base, rollout, {"_target_": "rewards.toy.ToyEnv"}, resource_pool=pools.sampler)
    trainer = TrainerGroup(pools.trainer, other, group(TrainerConfig, "trainer/fsdp2"), None,
                           max_response_length=8, temperature=TEMPERATURE, total_optim_steps=1)
    model0, _ = load_model_and_tokenizer(base)
    model1, _ = load_model_and_tokenizer(other)
    tasks = [TaskRef("toy/a", {"prompt": "say a"}), TaskRef("toy/b", {"prompt": "say b"})]
    try:
        before = asyncio.run(generate(samplers, 0, tasks))
        assert max_gap(model0, before) < 1e-4 and max_gap(model1, before) > 1e-2

        assert choose_transport("auto", colocated=False, on_gpu=False) == "object_store"
        sync = make_weight_push(trainer, samplers, "object_store", timeout_s=120)
        seconds = asyncio.run(sync.push(1))
        assert seconds > 0
        stats = sync.last_stats  # every tensor compared on every engine, the time split in parts
        assert stats["checked_tensors"] == len(model1.state_dict())
        assert stats["load_s"] > 0 and stats["check_s"] > 0
        assert abs(stats["transport_s"] + stats["load_s"] + stats["check_s"] - seconds) < 1e-6
        after = asyncio.run(generate(samplers, 1, tasks))
        assert {s.policy_version for s in after} == {1}
        assert len({s.task_id for s in after}) == 2  # both workers generated
        assert max_gap(model1, after) < 1e-4

        # back to the base weights with a plain state dict, then the broadcast transport
        asyncio.run(samplers.update_weights(dict(model0.state_dict()), 2))
        assert max_gap(model0, asyncio.run(generate(samplers, 2, tasks))) < 1e-4
        bsync = make_weight_push(trainer, samplers, "broadcast", timeout_s=120)
        asyncio.run(bsync.push(3))
        again = asyncio.run(generate(samplers, 3, tasks))
        assert {s.policy_version for s in again} == {3}
        assert max_gap(model1, again) < 1e-4

        # a lost sampler is replaced (with the base weights: version 0); the next push forms the
        # group again with the replacement in it instead of hanging on the lost member
        import ray

        ray.kill(samplers.workers[0])
        replaced = asyncio.run(generate(samplers, 4, tasks))
        assert samplers.restarts == 1 and len(replaced) == len(before)
        assert 0 in {s.policy_version for s in replaced}
        asyncio.run(bsync.push(5))
        last = asyncio.run(generate(samplers, 5, tasks))
        assert {s.policy_version for s in last} == {5} and len({s.task_id for s in last}) == 2
        assert max_gap(model1, last) < 1e-4

        # a sampler SIGKILLed inside a broadcast push (the tensors travel once, in a collective it
        # was part of): it is replaced, the group formed again and the push made again, to both
        prepare = bsync.prepare

        async def held_prepare(version):
            return HeldBroadcast(await prepare(version), str(tmp_path / "held"))

        bsync.prepare = held_prepare
        pids = {p["pid"] for p in asyncio.run(samplers.ping())}
        killed = asyncio.run(_push_and_kill(bsync, 6, tmp_path / "held"))
        assert killed in pids and samplers.restarts == 2
        held = asyncio.run(samplers.ping())
        assert killed not in {p["pid"] for p in held} and [p["version"] for p in held] == [6, 6]
        last = asyncio.run(generate(samplers, 6, tasks))
        assert {s.policy_version for s in last} == {6} and max_gap(model1, last) < 1e-4
    finally:
        samplers.shutdown()
        trainer.shutdown()
        pools.remove()


def test_unknown_transport_is_named():
    with pytest.raises(ValueError, match="pipeline.weight_push='nvlink'"):
        choose_transport("nvlink", colocated=False, on_gpu=True)


def test_flat_buffers_give_back_the_tensors_as_views():
    bucket = [("w", torch.randn(3, 5)), ("steps", torch.arange(7, dtype=torch.int32)),
              ("scale", torch.tensor(2.5)), ("none", torch.zeros(0, 4)), ("b", torch.randn(11)),
              ("mask", torch.tensor([True, False, True])), ("v", torch.randn(2, 3))]
    layouts = flat_layouts(bucket)
    # one buffer per dtype, in first-seen order
    assert [layout.dtype for layout in layouts] == ["float32", "int32", "bool"]
    flats = pack(layouts, dict(bucket).__getitem__, torch.device("cpu"))
    got = {}
    for layout, flat in zip(layouts, flats):
        assert flat.shape == (layout.numel,) and flat.dtype == getattr(torch, layout.dtype)
        end = 0
        for name, view in layout.views(flat):
            start = view.storage_offset()
            assert view.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()  # no copy
            assert start >= end and start * flat.element_size() % 16 == 0  # disjoint, aligned
            end = start + view.numel()
            got[name] = view
    assert list(got) == ["w", "scale", "none", "b", "v", "steps", "mask"]
    for name, t in bucket:
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)


def test_a_tied_weight_reaches_an_hf_engine_once_and_updates_both_names():
    from pipeline.engines.hf import HFEngine

    model_cfg = group(ModelConfig, "model/tiny", **{"tiny.tie_word_embeddings": True})
    trainer_model, _ = load_model_and_tokenizer(model_cfg)
    untied = group(ModelConfig, "model/tiny")
    sd = trainer_model.state_dict()
    assert "lm_head.weight" in sd and sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
    sent = without_aliases(sd)
    assert "lm_head.weight" not in sent and len(sent) == len(sd) - 1
    # an untied model's two weights are separate tensors: both stay
    assert "lm_head.weight" in without_aliases(load_model_and_tokenizer(untied)[0].state_dict())
    sampler_model, tok = load_model_and_tokenizer(model_cfg)
    engine = HFEngine(sampler_model, tok, device="cpu")
    with torch.no_grad():
        for t in sent.values():
            if t.is_floating_point():
                t.add_(1.0)  # the trainer moved on; the engine's copy is now stale
    assert not torch.equal(sampler_model.lm_head.weight, trainer_model.lm_head.weight)
    engine.load_weights(sent.items(), version=1)
    assert torch.equal(sampler_model.lm_head.weight, trainer_model.lm_head.weight)
    assert torch.equal(sampler_model.model.embed_tokens.weight, trainer_model.model.embed_tokens.weight)


def test_engine_checksums_catch_a_changed_tensor():
    """What a push's verification relies on: the HF engine's comparison passes after a load and
    names the one tensor that differs once it changes."""
    from pipeline.engines.hf import HFEngine

    import copy

    sampler_model, tok = load_model_and_tokenizer(group(ModelConfig, "model/tiny"))
    trainer_model = copy.deepcopy(sampler_model)
    with torch.no_grad():
        for p in trainer_model.parameters():
            p.add_(torch.randn_like(p) * 1e-2)
    engine = HFEngine(sampler_model, tok, device="cpu")
    sent = list(without_aliases(trainer_model.state_dict()).items())
    expected = checksums(sent)
    assert engine.check_weights(expected)["problems"]  # not loaded yet: everything differs
    engine.load_weights(sent, version=1)
    ok = engine.check_weights(expected)
    assert ok["problems"] == [] and ok["checked"] == len(sent)
    with torch.no_grad():
        sampler_model.model.layers[0].mlp.up_proj.weight[3, 5] += 1e-3
    bad = engine.check_weights(expected)
    assert len(bad["problems"]) == 1 and "layers.0.mlp.up_proj.weight" in bad["problems"][0]


def test_cuda_ipc_buffers_persist_across_pushes():
    """cuda_ipc's sender on a one-rank FSDP2 trainer (gloo, on CPU: the packing and the version
    header; the GPU test maps them from another process): tied embeddings, a non-float buffer,
    bf16 export. A second push after an optimiser-like update writes the new values into the same
    storage, behind the new version; the broadcast sender packs the same tensors."""
    cfg = group(TrainerConfig, "trainer/fsdp2", weight_bucket_mb=0.05, export_dtype="bfloat16")
    model_cfg = group(ModelConfig, "model/tiny", **{"tiny.tie_word_embeddings": True})
    worker = TrainerWorker(0, 1, model_cfg, cfg, None, max_response_length=8, temperature=1.0,
                           total_optim_steps=1)
    worker.init("127.0.0.1", free_port())

    def expected():
        return {k: v.to(torch.bfloat16) if v.is_floating_point() else v
                for k, v in worker.full_state_dict().items()}

    def packed(sender):
        return {name: view.clone() for layout, flat in zip(sender.layouts, sender.flats)
                for name, view in layout.views(flat)}

    try:
        worker.model.model.norm.register_buffer("steps", torch.arange(5, dtype=torch.int32))
        want = expected()
        # the object store and broadcast send the tied weight once too (their gathered state
        # dicts hold it twice, in separate storage)
        assert set(worker.exported_state_dict()) == set(want) - {"lm_head.weight"}
        sent = worker.weight_sender_call("broadcast", "prepare", 1, True)
        broadcast_names = {name for layout in sent.buffers for name, _, _ in layout.tensors}
        assert broadcast_names == set(want) - {"lm_head.weight"} and len(sent.buffers) > 2  # buckets
        for layout, flat in zip(sent.buffers, worker.weight_sender("broadcast").flats):
            for name, view in layout.views(flat):
                assert torch.equal(view, want[name]), name
        assert set(sent.checksums) == broadcast_names

        sender = worker.weight_sender("cuda_ipc")
        sender.pack(1)
        assert [layout.dtype for layout in sender.layouts] == ["bfloat16", "int32"]  # one per dtype
        assert int(sender.header) == 1
        got = packed(sender)
        # the tied lm_head is the embedding: sent once, under the embedding's name
        assert set(got) == set(want) - {"lm_head.weight"} and "model.embed_tokens.weight" in got
        for name, t in got.items():
            assert t.dtype == want[name].dtype and torch.equal(t, want[name]), name
        pointers = [flat.data_ptr() for flat in sender.flats]
        with torch.no_grad():  # the optimiser steps in place
            for p in worker.model.parameters():
                p.to_local().add_(0.5)
        sender.pack(2)
        assert [flat.data_ptr() for flat in sender.flats] == pointers and int(sender.header) == 2
        want2, got2 = expected(), packed(sender)
        assert not torch.equal(want2["model.norm.weight"], want["model.norm.weight"])
        for name, t in got2.items():
            assert torch.equal(t, want2[name]), name
    finally:
        worker.shutdown()


def test_a_sampler_keeps_one_receiver_state_per_transport():
    """The receiver states come from the registry, each made once per process and kept across
    pushes; a transport without one gets None, an unknown name is refused by name, and broadcast
    weights handed to a sampler outside the weight group say so."""
    from pipeline.weight_push import REGISTRY, WeightReceiver
    from pipeline.weight_push.broadcast import BroadcastReceiver

    recv = WeightReceiver(REGISTRY)
    assert recv.state("object_store") is None
    joined = recv.state("broadcast")
    assert isinstance(joined, BroadcastReceiver) and recv.state("broadcast") is joined
    with pytest.raises(ValueError, match="'nvlink'"):
        recv.call("nvlink", "join")
    with pytest.raises(RuntimeError, match="before join"):
        list(recv.named_tensors(BroadcastWeights(1)))
