"""CUDA IPC weight transfer on one GPU (trainer rank and a receiving process share the device)."""
import multiprocessing as mp

import pytest

from pipeline.models import ModelConfig
from pipeline.trainer import TrainerConfig, TrainerWorker
from pipeline.trainer.worker import free_port
from pipeline.weight_sync import WeightReceiver, ipc_bucket, ipc_prepare, ipc_release
from tests.pipeline.conftest import group


def _receive(q_in, q_out):
    recv = WeightReceiver()
    while True:
        payload = q_in.get()
        if payload is None:
            return
        # what a sampler engine does with it: copy out of the mapped memory
        q_out.put({name: (t.device.type, t.float().sum().item(), tuple(t.shape))
                   for name, t in recv.named_tensors(payload)})


@pytest.mark.gpu
def test_cuda_ipc_buckets_arrive_intact():
    worker = TrainerWorker(0, 1, group(ModelConfig, "model/tiny"),
                           group(TrainerConfig, "trainer/fsdp2", weight_bucket_mb=0.05), None,
                           max_response_length=8, temperature=1.0, total_optim_steps=1)
    worker.init("127.0.0.1", free_port())
    expected = {k: v.to(worker.export_dtype()).float().sum().item()
                for k, v in worker.full_state_dict().items()}
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receive, args=(q_in, q_out))
    proc.start()
    try:
        n = ipc_prepare(worker)
        assert n > 1  # several buckets: the bucketing is exercised
        got = {}
        for i in range(n):
            q_in.put(ipc_bucket(worker, i, version=1))
            got.update(q_out.get(timeout=120))
        ipc_release(worker)
    finally:
        q_in.put(None)
        proc.join(60)
        worker.shutdown()
    assert set(got) == set(expected)
    for name, (device, total, _) in got.items():
        assert device == "cuda"
        assert total == pytest.approx(expected[name], rel=1e-3, abs=1e-3)
