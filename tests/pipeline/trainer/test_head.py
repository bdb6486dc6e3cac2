"""The compiled log-prob head (trainer.compile_head) against verl's FusedLinearForPPO, the default:
the same log-probs, entropy and gradients, chunks that do not divide the tokens included."""
import pytest
import torch

from pipeline.trainer.head import CompiledLogProbHead


def _run(head, hidden, weight, targets, temperature, up_logp, up_ent):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, ent = head(h, w, targets, temperature)
    loss = (logp * up_logp).sum() + ((ent.float() * up_ent).sum() if up_ent is not None else 0.0)
    loss.backward()
    return logp.detach(), ent.detach(), h.grad, w.grad


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("with_entropy_grad", [False, True])
def test_compiled_head_matches_verls_head(dtype, tol, with_entropy_grad):
    from verl.utils.experimental.torch_functional import FusedLinearForPPO

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    B, R, d, V, chunk, temperature = 2, 5, 16, 40, 3, 0.7  # 10 tokens in chunks of 3: the last has 1
    hidden = torch.randn(B, R, d, generator=gen).to(dtype)
    weight = (torch.randn(V, d, generator=gen) / d ** 0.5).to(dtype)
    targets = torch.randint(0, V, (B, R), generator=gen)
    up_logp = torch.randn(B, R, generator=gen)
    up_ent = torch.randn(B, R, generator=gen) if with_entropy_grad else None
    want = _run(FusedLinearForPPO(chunk_size=chunk), hidden, weight, targets, temperature, up_logp, up_ent)
    from torch._dynamo.utils import counters

    counters.clear()
    got = _run(CompiledLogProbHead(chunk), hidden, weight, targets, temperature, up_logp, up_ent)
    for name, w, g in zip(("log-probs", "entropy", "hidden grad", "weight grad"), want, got):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        scale = w.float().abs().max().clamp_min(1e-6)
        assert float((g.float() - w.float()).abs().max() / scale) <= tol, name
    assert got[0].dtype == torch.float32
    assert counters["frames"]["ok"] >= 2  # the chunk bodies ran compiled, not eager
