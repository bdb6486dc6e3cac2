"""CUDA IPC weight transfer on one GPU: an FSDP2 trainer rank packs its weights into persistent
flat buffers (one per dtype), and a receiving process that sees the GPUs in another order (as a
sampler actor may) maps them once, at the first push, and gets the trainer's weights bit for bit
at every push after it; a payload whose version the buffers do not hold is refused."""
import multiprocessing as mp
import os
import time

import pytest
import torch

from pipeline.models import ModelConfig
from pipeline.trainer import TrainerConfig, TrainerWorker
from pipeline.trainer.worker import free_port
from pipeline.weight_push import REGISTRY, WeightReceiver
from tests.pipeline.conftest import group


def _receive(q_in, q_out):
    recv = WeightReceiver(REGISTRY)
    while (payload := q_in.get()) is not None:
        try:
            # what a sampler engine does with the views: copy out of the mapped memory
            got = {name: (t.device.index, t.cpu()) for name, t in recv.named_tensors(payload)}
            recv.finish(payload)
            mapped = recv.state("cuda_ipc").mapped
            q_out.put((got, id(mapped), mapped.buffer_id))
        except Exception as e:
            q_out.put(f"{type(e).__name__}: {e}")


def _reversed_visible_devices() -> str:
    """This process's GPUs in reverse order: the trainer's device 0 is the receiver's last, so
    with several GPUs the receiver must remap the device index (one GPU: the same order)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    return ",".join(reversed(ids))


@pytest.mark.gpu
def test_cuda_ipc_persistent_buffers_arrive_intact_at_every_push():
    model_cfg = group(ModelConfig, "model/tiny", **{"tiny.tie_word_embeddings": True})
    trainer_cfg = group(TrainerConfig, "trainer/fsdp2")
    worker = TrainerWorker(0, 1, model_cfg, trainer_cfg, None, max_response_length=8,
                           temperature=1.0, total_optim_steps=1)
    worker.init("127.0.0.1", free_port())
    # Qwen2 has no persistent non-float buffer: add one, which must keep its dtype
    steps = torch.arange(5, dtype=torch.int32, device=worker.device)
    worker.model.model.norm.register_buffer("steps", steps)
    dtype = worker.export_dtype()

    def expected():
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in worker.full_state_dict().items()}

    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receive, args=(q_in, q_out))
    with pytest.MonkeyPatch.context() as env:  # the receiver's GPU order only
        env.setenv("CUDA_VISIBLE_DEVICES", _reversed_visible_devices())
        proc.start()
    rounds, send_s = [], []
    try:
        for version in (1, 2, 3):
            if version > 1:
                with torch.no_grad():  # the optimiser steps in place
                    for p in worker.model.parameters():
                        p.to_local().mul_(1.5)
            t0 = time.perf_counter()
            payload = worker.weight_sender_call("cuda_ipc", "send", version, True)
            send_s.append(time.perf_counter() - t0)
            q_in.put(payload)
            answer = q_out.get(timeout=120)
            assert not isinstance(answer, str), answer
            rounds.append((expected(), payload, *answer))
        stale = worker.weight_sender_call("cuda_ipc", "send", 4, False)
        stale.version = 3  # handed over out of order: the header holds 4
        q_in.put(stale)
        refused = q_out.get(timeout=120)
    finally:
        q_in.put(None)
        proc.join(60)
        worker.shutdown()
    assert isinstance(refused, str) and "holds version 4" in refused
    print(f"cuda_ipc send (pack + checksums) of the tiny model: {[f'{s * 1e3:.2f} ms' for s in send_s]}")
    last = torch.cuda.device_count() - 1
    mappings = {(mapped_id, buffer_id) for _, _, _, mapped_id, buffer_id in rounds}
    assert len(mappings) == 1  # mapped once, at the first push, and kept
    for want, payload, got, _, _ in rounds:
        assert [layout.dtype for layout, _, _ in payload.buffers] == ["bfloat16", "int32"]
        # tied: the shared weight goes once, under the embedding's name (weight_push.without_aliases)
        assert set(got) == set(want) - {"lm_head.weight"} and "model.embed_tokens.weight" in got
        assert set(payload.checksums) == set(got)
        for name, (index, t) in got.items():
            assert index == last, name  # mapped on the trainer's GPU as the receiver numbers it
            assert t.dtype == want[name].dtype and torch.equal(t, want[name]), (payload.version, name)
    assert not torch.equal(rounds[0][2]["model.norm.weight"][1], rounds[2][2]["model.norm.weight"][1])
