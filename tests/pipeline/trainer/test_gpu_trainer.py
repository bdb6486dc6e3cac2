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
        # trainer.remove_padding=auto packs on GPU, through flash-attn when installed, else torch's varlen kernel
        assert info["remove_padding"] and info["attn_implementation"] in ("varlen", "flash_attention_2")
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


@pytest.mark.gpu
def test_packed_log_probs_match_padded_in_bf16_on_gpu():
    """Packed rows through torch's varlen flash kernel against padded rows through SDPA, bf16 on
    the GPU: the same response log-probs within bf16 noise (documented tolerance: max 0.02, mean
    2e-3 nats per token; the same comparison in bf16 on CPU differs by max 0.002, mean 1.6e-4)."""
    import copy

    from pipeline.models import load_model_and_tokenizer
    from pipeline.trainer import varlen
    from pipeline.trainer.forward import attention_implementation, log_probs

    model, tok = load_model_and_tokenizer(group(ModelConfig, "model/tiny"))
    algo = group(AlgorithmConfig, "algorithm/grpo_plus")
    batch = build_train_batch(make_samples(len(tok), seed=5), algo, MAX_RESPONSE, tok.pad_token_id)
    rows = {k: getattr(batch, k) for k in BATCH_KEYS}
    dev = torch.device("cuda", 0)
    out = {}
    for packed in (False, True):
        m = copy.deepcopy(model).to(dev, torch.bfloat16)
        m.set_attn_implementation(attention_implementation("sdpa" if not packed else varlen.NAME, packed, True))
        mb, lp, _ = log_probs(m, rows, dev, 1.0, False, packed, False)
        out[packed] = lp.float() * mb["response_mask"].to(dev)
        lp.sum().backward()  # the kernel's backward runs too
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    assert varlen.kernel_available(dev, torch.bfloat16)
    diff = (out[True] - out[False]).abs()
    n = batch.response_mask.sum().item()
    assert diff.max().item() <= 0.02 and diff.sum().item() / n <= 2e-3, (diff.max().item(), diff.sum().item() / n)
