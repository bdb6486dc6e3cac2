import torch

from pipeline.algorithms import overlong_loss_mask, zero_advantage_groups

TRUNC = torch.tensor([True, False, True, False])
MASK = torch.ones(4, 3)
SCORES = torch.tensor([0.0, 0.0, 1.3, 0.3])


def test_mask_mode_drops_every_truncated_row():
    m, f = overlong_loss_mask(TRUNC, MASK, "mask", SCORES)
    assert f.tolist() == [True, False, True, False]
    assert m.sum(1).tolist() == [0.0, 3.0, 0.0, 3.0]


def test_deepcoder_mode_drops_only_truncated_rows_that_scored_zero():
    m, f = overlong_loss_mask(TRUNC, MASK, "deepcoder", SCORES)
    assert f.tolist() == [True, False, False, False]
    assert m.sum(1).tolist() == [0.0, 3.0, 3.0, 3.0]


def test_off_mode_keeps_everything():
    m, f = overlong_loss_mask(TRUNC, MASK, "off")
    assert not f.any() and torch.equal(m, MASK)


def test_zero_advantage_groups():
    adv = torch.tensor([0.0, 0.0, 0.5, -0.5, 0.0, 1.0])
    ids = ["a", "a", "b", "b", "c", "c"]
    # c's only non-zero sample was filtered out of the loss: c has nothing left to learn
    live = torch.tensor([True, True, True, True, True, False])
    z = zero_advantage_groups(adv, ids, live)
    assert z.groups == ["a", "c"] and z.n_samples == 4
    assert z.keep.tolist() == [False, False, True, True, False, False]
    assert zero_advantage_groups(adv, ids).groups == ["a"]
