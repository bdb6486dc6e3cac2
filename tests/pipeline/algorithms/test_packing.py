"""pack: the packed layout of TrainBatch rows (that packed rows train like padded ones through
the trainer's forward: tests/pipeline/trainer/test_packed_trainer.py)."""
import torch

from pipeline.algorithms import build_train_batch, pack
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


def test_subset_of_rows():
    b = build_train_batch(samples(50), algo(), 8, 0)
    p = pack(b.input_ids[2:3], b.attention_mask[2:3], b.response_mask[2:3], b.prompt_len)
    assert p.cu_seqlens.tolist() == [0, int(b.attention_mask[2].sum())]


def test_positions_restart_and_logit_index_points_before_each_response_token():
    b = build_train_batch(samples(50), algo(), 8, 0)
    p = pack(b.input_ids, b.attention_mask, b.response_mask, b.prompt_len)
    cu = p.cu_seqlens.tolist()
    assert p.input_ids.shape[1] == int(b.attention_mask.sum()) == cu[-1]  # no padding left
    for k, (s, e) in enumerate(zip(cu[:-1], cu[1:])):
        assert p.position_ids[0, s:e].tolist() == list(range(e - s))
        present = p.response_present[k]
        # the token after each logit position is the response token it predicts
        assert p.input_ids[0, p.logit_index[k][present] + 1].tolist() == p.response_ids[k][present].tolist()
    flat = torch.arange(int(p.response_present.sum()), dtype=torch.float)
    assert p.unpack(flat)[p.response_present].tolist() == flat.tolist()
