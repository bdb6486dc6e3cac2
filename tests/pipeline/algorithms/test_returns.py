import pytest
import torch

from pipeline.algorithms import multi_turn_returns

S = torch.tensor([0.0, 0.3, 1.3, 0.0])


def test_discounted_sum_by_hand():
    # R3 = 0; R2 = 1.3; R1 = 0.3 + 0.4 * 1.3 = 0.82; R0 = 0 + 0.4 * 0.82 = 0.328
    r = multi_turn_returns(S, 0.4, "sum")
    torch.testing.assert_close(r, torch.tensor([0.328, 0.82, 1.3, 0.0]))


def test_discounted_max_by_hand():
    # R2 = 1.3; R1 = max(0.3, 0.4 * 1.3) = 0.52; R0 = max(0, 0.4 * 0.3, 0.16 * 1.3) = 0.208
    r = multi_turn_returns(S, 0.4, "max")
    torch.testing.assert_close(r, torch.tensor([0.208, 0.52, 1.3, 0.0]))


def test_max_keeps_own_score_when_larger():
    r = multi_turn_returns(torch.tensor([2.0, 1.0, 0.5]), 0.8, "max")
    torch.testing.assert_close(r, torch.tensor([2.0, 1.0, 0.5]))


def test_gamma_one_sum_is_suffix_sum():
    r = multi_turn_returns(torch.tensor([1.0, 2.0, 3.0]), 1.0, "sum")
    torch.testing.assert_close(r, torch.tensor([6.0, 5.0, 3.0]))


def test_early_ended_trajectory_and_batch_dims():
    scores = torch.tensor([[0.0, 0.3, 1.3, 0.0], [1.0, 2.0, 99.0, 99.0]])
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    for agg, second in (("sum", [1.8, 2.0, 0.0, 0.0]), ("max", [1.0, 2.0, 0.0, 0.0])):
        r = multi_turn_returns(scores, 0.4, agg, mask)
        torch.testing.assert_close(r[1], torch.tensor(second))  # the 99s never leak in
        torch.testing.assert_close(r[0], multi_turn_returns(scores[0], 0.4, agg))


def test_against_the_definition_on_random_input():
    g = torch.Generator().manual_seed(0)
    s = torch.rand(5, 6, generator=g, dtype=torch.float64) * 2 - 0.5
    for agg in ("sum", "max"):
        r = multi_turn_returns(s, 0.4, agg)
        for t in range(6):
            terms = torch.stack([0.4 ** (k - t) * s[:, k] for k in range(t, 6)], -1)
            want = terms.sum(-1) if agg == "sum" else terms.max(-1).values
            torch.testing.assert_close(r[:, t], want)


@pytest.mark.parametrize("kw", [{"gamma": 0.0}, {"aggregate": "mean"}])
def test_rejects_bad_arguments(kw):
    args = {"gamma": 0.4, "aggregate": "sum", **kw}
    with pytest.raises(ValueError, match="algorithm."):
        multi_turn_returns(S, args["gamma"], args["aggregate"])
