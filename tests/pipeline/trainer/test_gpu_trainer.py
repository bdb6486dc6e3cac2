"""One FSDP2 rank on a GPU (NCCL, bf16 compute, fp32 master weights): a real training step."""
import pytest
import torch

from pipeline.algorithms import AlgorithmConfig, build_train_batch
from pipeline.models import ModelConfig
from pipeline.trainer import TrainerConfig, TrainerWorker, plan_step
from pipeline.trainer.worker import BATCH_KEYS, free_port
from tests.pipeline.conftest import group
from tests.pipeline.trainer.test_trainer import MAX_RESPONSE, make_samples


@pytest.mark.gpu
def test_bf16_step_on_gpu():
    algo = group(AlgorithmConfig, "algorithm/grpo_plus", micro_batch_tokens=40)
    worker = TrainerWorker(0, 1, group(ModelConfig, "model/tiny"),
                           group(TrainerConfig, "trainer/fsdp2", **{"optim.lr": 1e-3}), algo,
                           MAX_RESPONSE, temperature=1.0, total_optim_steps=2)
    info = worker.init("127.0.0.1", free_port())
    try:
        assert info["backend"] == "nccl" and info["device"] == "cuda:0"
        before = {k: v.clone() for k, v in worker.full_state_dict().items()}
        assert all(v.dtype == torch.float32 for v in before.values())  # fp32 master weights
        batch = build_train_batch(make_samples(512), algo, MAX_RESPONSE, 0)
        plan = plan_step(batch.attention_mask.sum(1).tolist(), batch.response_mask.sum(1).tolist(),
                         1, algo.ppo_mini_batches, algo.micro_batch_tokens)
        rows = torch.tensor(plan.ranks[0].rows)
        shard = {k: getattr(batch, k)[rows] for k in BATCH_KEYS}
        m = worker.train_step(shard, plan.ranks[0], plan.global_seqs, plan.global_tokens, MAX_RESPONSE)
        assert torch.isfinite(torch.tensor(m["actor/loss"])) and m["actor/grad_norm"] > 0
        after = worker.full_state_dict()
        assert max((after[k] - before[k]).abs().max().item() for k in after) > 1e-5
        assert worker.export_dtype() == torch.bfloat16
    finally:
        worker.shutdown()
