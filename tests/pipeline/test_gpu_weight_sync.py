"""CUDA IPC weight transfer on one GPU: an FSDP2 trainer rank packs each bucket into one flat
buffer per dtype, and a receiving process that sees the GPUs in another order (as a sampler
actor may) maps them and gets the trainer's weights, bit for bit."""
import multiprocessing as mp
import os
import weakref

import pytest
import torch

from pipeline.models import ModelConfig
from pipeline.trainer import TrainerConfig, TrainerWorker
from pipeline.trainer.worker import free_port
from pipeline.weight_sync import WeightReceiver, ipc_bucket, ipc_prepare, ipc_release
from tests.pipeline.conftest import group


def _receive(q_in, q_out):
    recv = WeightReceiver()
    while (payload := q_in.get()) is not None:
        # what a sampler engine does with the views: copy out of the mapped memory
        q_out.put({name: (t.device.index, t.cpu()) for name, t in recv.named_tensors(payload)})


def _reversed_visible_devices() -> str:
    """This process's GPUs in reverse order: the trainer's device 0 is the receiver's last, so
    with several GPUs the receiver must remap the device index (one GPU: the same order)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    return ",".join(reversed(ids))


@pytest.mark.gpu
def test_cuda_ipc_flat_buckets_arrive_intact():
    model_cfg = group(ModelConfig, "model/tiny", **{"tiny.tie_word_embeddings": True})
    trainer_cfg = group(TrainerConfig, "trainer/fsdp2", weight_bucket_mb=0.05)
    worker = TrainerWorker(0, 1, model_cfg, trainer_cfg, None, max_response_length=8,
                           temperature=1.0, total_optim_steps=1)
    worker.init("127.0.0.1", free_port())
    # Qwen2 has no persistent non-float buffer: add one, which must keep its dtype
    steps = torch.arange(5, dtype=torch.int32, device=worker.device)
    worker.model.model.norm.register_buffer("steps", steps)
    dtype = worker.export_dtype()
    expected = {k: v.to(dtype) if v.is_floating_point() else v
                for k, v in worker.full_state_dict().items()}
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receive, args=(q_in, q_out))
    with pytest.MonkeyPatch.context() as env:  # the receiver's GPU order only
        env.setenv("CUDA_VISIBLE_DEVICES", _reversed_visible_devices())
        proc.start()
    got, dtypes, previous = {}, [], []
    try:
        n = ipc_prepare(worker)
        assert n > 1  # several buckets: the bucketing is exercised
        for i in range(n):
            payload = ipc_bucket(worker, i, version=1)
            # the trainer holds this bucket's buffers only: the previous ones are gone
            assert all(ref() is None for ref in previous)
            previous = [weakref.ref(flat) for flat in worker._ipc_live]
            dtypes.append([layout.dtype for layout, _, _ in payload.buffers])
            q_in.put(payload)
            got.update(q_out.get(timeout=120))
        ipc_release(worker)
    finally:
        q_in.put(None)
        proc.join(60)
        worker.shutdown()
    assert ["bfloat16", "int32"] in dtypes  # one buffer (one handle) per dtype of a bucket
    # tied: the shared weight goes once, under the embedding's name (weight_sync.without_aliases)
    assert set(got) == set(expected) - {"lm_head.weight"} and "model.embed_tokens.weight" in got
    last = torch.cuda.device_count() - 1
    for name, (index, t) in got.items():
        assert index == last, name  # mapped on the trainer's GPU as the receiver numbers it
        assert t.dtype == expected[name].dtype and torch.equal(t, expected[name]), name
