"""Packed rows give the same response log-probs as padded rows through a real tiny Qwen2."""
import pytest
import torch
from omegaconf import OmegaConf

from pipeline.algorithms import build_train_batch
from pipeline.algorithms import pack_rows
from pipeline.models import ModelConfig, load_model_and_tokenizer
from pipeline.sample import Sample
from tests.pipeline.algorithms.conftest import algo


def samples(vocab):
    g = torch.Generator().manual_seed(0)
    out = []
    for j, (p, r) in enumerate([(4, 6), (7, 2), (2, 5), (5, 1)]):
        out.append(Sample(uid=f"0/t/{j}/0", step=0, task_id="t", traj=j, turn=0,
                          prompt_ids=torch.randint(3, vocab, (p,), generator=g).tolist(),
                          response_ids=torch.randint(3, vocab, (r,), generator=g).tolist(),
                          logprobs=[-1.0] * r, finish_reason="stop", score=float(j), policy_version=0))
    return out


@pytest.fixture(scope="module")
def model():
    root = OmegaConf.load("conf/model/tiny.yaml")
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), root))
    m, tok = load_model_and_tokenizer(cfg)
    m.config._attn_implementation = "sdpa"
    return m.eval(), tok


def test_packed_log_probs_equal_padded(model):
    m, tok = model
    b = build_train_batch(samples(len(tok)), algo(), 8, tok.pad_token_id)
    P, R = b.prompt_len, b.response_len
    with torch.no_grad():
        logits = m(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
        padded = torch.log_softmax(logits[:, P - 1:P + R - 1].float(), -1).gather(
            -1, b.input_ids[:, P:].unsqueeze(-1)).squeeze(-1)
        packed = pack_rows(b)
        assert packed.input_ids.shape[1] == int(b.attention_mask.sum())  # no padding left
        assert packed.cu_seqlens.tolist()[-1] == packed.input_ids.shape[1]
        plogits = m(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits
        ours = torch.log_softmax(packed.gather(plogits).float(), -1).gather(
            -1, packed.response_ids.unsqueeze(-1)).squeeze(-1)
    mask = b.response_mask.bool()
    torch.testing.assert_close(ours[mask], padded[mask], atol=1e-5, rtol=1e-5)
    # sanity: without the restarting positions the sequences would see each other
    with torch.no_grad():
        wrong = m(input_ids=packed.input_ids, use_cache=False).logits
    leaked = torch.log_softmax(packed.gather(wrong).float(), -1).gather(
        -1, packed.response_ids.unsqueeze(-1)).squeeze(-1)
    assert (leaked[mask] - padded[mask]).abs().max() > 1e-3


def test_subset_of_rows():
    b = build_train_batch(samples(50), algo(), 8, 0)
    p = pack_rows(b, [2])
    assert p.rows == [2] and p.cu_seqlens.tolist() == [0, int(b.attention_mask[2].sum())]
