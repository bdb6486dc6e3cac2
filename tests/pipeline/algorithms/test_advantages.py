import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from pipeline.algorithms import group_advantages


def test_by_hand_with_and_without_std():
    r = torch.tensor([1.0, 3.0, 0.0, 0.0, 6.0])
    ids = ["a", "a", "b", "b", "b"]
    # a: mean 2, unbiased std sqrt(2); b: mean 2, std sqrt(12)
    plain = group_advantages(r, ids, norm_by_std=False, eps=1e-6)
    torch.testing.assert_close(plain, torch.tensor([-1.0, 1.0, -2.0, -2.0, 4.0]))
    normed = group_advantages(r, ids, norm_by_std=True, eps=0.0)
    s2, s12 = 2 ** 0.5, 12 ** 0.5
    torch.testing.assert_close(normed, torch.tensor([-1 / s2, 1 / s2, -2 / s12, -2 / s12, 4 / s12]))


def test_singleton_and_constant_groups_get_exactly_zero():
    r = torch.tensor([0.7, 0.328, 0.328, 0.328, 5.0])
    adv = group_advantages(r, [0, 1, 1, 1, 2], norm_by_std=True, eps=1e-6)
    assert torch.equal(adv, torch.zeros(5))  # verl would give 0.7, rounding noise / eps, 5.0


def test_parity_with_verl_on_random_input():
    g = torch.Generator().manual_seed(1)
    n = 64
    r = torch.rand(n, generator=g) * 3
    ids = [int(x) for x in torch.randint(0, 5, (n,), generator=g)]
    for norm in (True, False):
        ours = group_advantages(r, ids, norm_by_std=norm, eps=1e-6)
        mask = torch.zeros(n, 7)
        lens = torch.randint(1, 8, (n,), generator=g)
        for i, length in enumerate(lens):
            mask[i, :length] = 1
        rewards = torch.zeros(n, 7)
        rewards[torch.arange(n), lens - 1] = r  # the return as the last token's reward
        theirs, _ = compute_grpo_outcome_advantage(rewards, mask, np.array(ids), 1e-6, norm)
        torch.testing.assert_close(ours.unsqueeze(1) * mask, theirs, atol=1e-6, rtol=1e-6)


def test_empty():
    assert group_advantages(torch.zeros(0), [], True, 1e-6).shape == (0,)


def test_a_group_equal_up_to_rounding_is_constant():
    one_ulp = float(np.nextafter(np.float32(1.0), np.float32(2.0)))
    r = torch.tensor([1.0] * 63 + [one_ulp], dtype=torch.float32)
    assert float(r[-1]) != 1.0  # really one ulp apart
    ids = ["a"] * 64
    for norm in (True, False):
        assert torch.equal(group_advantages(r, ids, norm_by_std=norm, eps=1e-6), torch.zeros(64))
    # relative to the group's scale: returns near 1000 that differ in the 7th digit are constant too
    big = torch.tensor([1000.0, 1000.0 + 5e-4], dtype=torch.float64)
    assert torch.equal(group_advantages(big, ["b", "b"], True, 1e-6), torch.zeros(2, dtype=torch.float64))


def test_a_group_with_a_real_difference_is_kept():
    r = torch.tensor([1.0] * 63 + [1.1])
    adv = group_advantages(r, ["a"] * 64, norm_by_std=True, eps=1e-6)
    assert adv[-1] > 1.0 and (adv[:-1] < 0).all()
    small = torch.tensor([0.0, 2e-6])  # below scale 1, the tolerance is absolute: 2e-6 > 1e-6 is kept
    assert group_advantages(small, ["s", "s"], False, 1e-6).abs().sum() > 0


def test_batch_drops_the_near_constant_group():
    from pipeline.algorithms.filters import zero_advantage_groups

    one_ulp = float(np.nextafter(np.float32(1.0), np.float32(2.0)))
    r = torch.tensor([1.0] * 63 + [one_ulp] + [1.0] * 63 + [1.1], dtype=torch.float32)
    ids = ["const"] * 64 + ["kept"] * 64
    z = zero_advantage_groups(group_advantages(r, ids, norm_by_std=True, eps=1e-6), ids)
    assert z.groups == ["const"] and z.n_samples == 64
