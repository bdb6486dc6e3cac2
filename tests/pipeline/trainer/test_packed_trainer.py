"""trainer.remove_padding on CPU (fp32): a packed micro-batch gives the padded one's loss and
gradients, through the trainer's own forward (pipeline/trainer/forward.py) and its varlen
attention (pipeline/trainer/varlen.py, per-sequence SDPA where torch's varlen kernel cannot run)."""
import copy

import pytest
import torch

from pipeline.algorithms import AlgorithmConfig, build_train_batch, policy_loss
from pipeline.models import ModelConfig, load_model_and_tokenizer
from pipeline.trainer import varlen
from pipeline.trainer.forward import attention_implementation, install_log_prob_head, log_probs
from pipeline.trainer.worker import BATCH_KEYS
from tests.pipeline.conftest import group
from tests.pipeline.trainer.test_trainer import MAX_RESPONSE, make_samples


@pytest.fixture(scope="module")
def setup():
    model, tok = load_model_and_tokenizer(group(ModelConfig, "model/tiny"))
    algo = group(AlgorithmConfig, "algorithm/grpo_plus")
    # mixed lengths: prompts of 3-9 tokens, responses of 2-12, left/right padding in one micro-batch
    batch = build_train_batch(make_samples(len(tok), seed=5), algo, MAX_RESPONSE, tok.pad_token_id)
    rows = {k: getattr(batch, k) for k in BATCH_KEYS}
    assert len(set(batch.attention_mask.sum(1).tolist())) > 3
    return model.float().train(), algo, rows


def step(model, algo, rows, packed, chunk):
    model = copy.deepcopy(model)
    attn = attention_implementation("auto", packed, on_gpu=False)
    model.set_attn_implementation(attn)
    if chunk:
        install_log_prob_head(model, chunk)
    mb, logp, ent = log_probs(model, rows, torch.device("cpu"), 0.7, chunk > 0, packed, True)
    mask = mb["response_mask"].float()
    old = logp.detach() + 0.05 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(0))
    loss, _ = policy_loss(old, logp, mb["advantages"].float(), mask, algo, MAX_RESPONSE, entropy=ent)
    loss.backward()
    return attn, loss.detach(), (logp * mask).detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("chunk", [0, 3])
def test_packed_step_equals_padded_step(setup, chunk):
    model, algo, rows = setup
    attn_pad, loss_pad, logp_pad, g_pad = step(model, algo, rows, False, chunk)
    attn_pk, loss_pk, logp_pk, g_pk = step(model, algo, rows, True, chunk)
    assert (attn_pad, attn_pk) == ("sdpa", varlen.NAME)
    torch.testing.assert_close(logp_pk, logp_pad, rtol=1e-5, atol=1e-6)
    assert loss_pk.item() == pytest.approx(loss_pad.item(), rel=1e-5)
    assert set(g_pk) == set(g_pad)
    for name, g in g_pad.items():
        scale = g.abs().max().item()
        assert scale > 0, name
        assert (g_pk[name] - g).abs().max().item() <= 1e-5 * scale, name


def test_varlen_attention_keeps_sequences_apart(setup):
    """The boundaries are what cu_seq_lens says: a packed row read as one sequence changes every
    sequence after the first, and each sequence alone gives what it gives in the packed row."""
    from pipeline.algorithms.packing import pack

    model, _, rows = setup
    m = copy.deepcopy(model).eval()
    m.set_attn_implementation(attention_implementation("varlen", True, on_gpu=False))
    R = rows["response_mask"].shape[1]
    p = pack(rows["input_ids"], rows["attention_mask"], rows["response_mask"], rows["input_ids"].shape[1] - R)
    T = p.input_ids.shape[1]
    with torch.no_grad():
        def run(cu, ids=p.input_ids, pos=p.position_ids):
            return m(input_ids=ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                     max_length_q=int((cu[1:] - cu[:-1]).max()), max_length_k=0, use_cache=False).logits
        apart = run(p.cu_seqlens)
        joined = run(torch.tensor([0, T], dtype=torch.int32))
        s, e = p.cu_seqlens[2].item(), p.cu_seqlens[3].item()
        alone = run(torch.tensor([0, e - s], dtype=torch.int32), p.input_ids[:, s:e], p.position_ids[:, s:e])
    first = p.cu_seqlens[1].item()
    torch.testing.assert_close(joined[:, :first], apart[:, :first])
    assert (joined[:, first:] - apart[:, first:]).abs().max() > 1e-2
    torch.testing.assert_close(alone[0], apart[0, s:e], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="remove_padding"):
        attention_implementation("varlen", False, on_gpu=False)
