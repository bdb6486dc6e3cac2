"""Why runs fell after all-correct batches, on a constructed nearly all-correct group.

15 correct answers and one wrong one that shares all but its last token with them (the laptop's
corpus answers differ in a few tokens). Under std normalisation the wrong answer gets A = -3.75
and each correct one +0.25: the group's advantages sum to 0, so the push on the tokens every
answer shares cancels. The old planner cut the rows in two contiguous halves, one optimiser step
each: the half holding the wrong answer sums to -2, the other to +2. AdamW sizes each step by the
gradient's own scale, so the first step pushes the shared tokens down in full and the second
hardly undoes it (its second moment still remembers the first): the correct answers lose
probability after a batch where 15 of 16 were correct. Planned by group, the one step holds the
whole group and the correct answers gain."""
import math

import pytest
import torch

from pipeline.algorithms import group_advantages, policy_loss
from pipeline.trainer.plan import micro_weight, plan_step, split_by_group
from tests.pipeline.algorithms.conftest import algo

V, L = 6, 4                       # vocabulary, response length
CORRECT, WRONG = [0, 1, 2, 3], [0, 1, 2, 4]


def _batch(wrong_at: int = 3, n: int = 16):
    seqs = torch.tensor([WRONG if i == wrong_at else CORRECT for i in range(n)])
    scores = torch.tensor([0.0 if i == wrong_at else 1.0 for i in range(n)])
    return seqs, scores, ["0/task"] * n


def _log_probs(logits: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    # a position-indexed policy: logits [L, V], the same for every row
    lp = torch.log_softmax(logits, -1)
    return lp[torch.arange(L)[None, :].expand_as(seqs), seqs]


def _train(by_group: bool, wrong_at: int = 3, lr: float = 1e-2) -> tuple[float, float]:
    """(log p(correct answer) before, after) one training step on the constructed batch, through
    the trainer's planner, loss, micro-batch weights, grad clip and AdamW."""
    cfg = algo("grpo_plus")
    seqs, scores, groups = _batch(wrong_at)
    adv = group_advantages(scores, groups, cfg.norm_by_std, cfg.adv_eps)
    torch.manual_seed(0)
    logits = torch.nn.Parameter(torch.randn(L, V) * 0.1)
    opt = torch.optim.AdamW([logits], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    mask = torch.ones(len(seqs), L)
    plan = plan_step([8 + L] * len(seqs), [L] * len(seqs), 1, cfg.ppo_mini_batches, 10_000,
                     groups=groups if by_group else None)
    rank = plan.ranks[0]
    with torch.no_grad():
        old = _log_probs(logits, seqs)
        before = float(_log_probs(logits, torch.tensor([CORRECT])).sum())
    for m, mini in enumerate(rank.mini_batches):
        for pos in mini:
            rows = torch.tensor([rank.rows[p] for p in pos])
            lp = _log_probs(logits, seqs[rows])
            loss, _ = policy_loss(old[rows], lp, adv[rows, None].expand(-1, L), mask[rows], cfg, L)
            w = micro_weight(cfg.loss_agg_mode, len(rows), len(rows) * L, plan.global_seqs[m],
                             plan.global_tokens[m])
            (loss * w).backward()
        torch.nn.utils.clip_grad_norm_([logits], cfg.grad_clip)
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        after = float(_log_probs(logits, torch.tensor([CORRECT])).sum())
    return before, after


def test_std_normalised_nearly_all_correct_group_gives_the_lone_wrong_answer_a_huge_advantage():
    seqs, scores, groups = _batch()
    adv = group_advantages(scores, groups, norm_by_std=True, eps=1e-6)
    assert float(adv[3]) == pytest.approx(-3.75, abs=1e-4)
    assert float(adv[0]) == pytest.approx(0.25, abs=1e-4)
    assert abs(float(adv.sum())) < 1e-4


def test_the_row_split_puts_the_wrong_answer_in_a_step_without_its_positive_partners():
    seqs, scores, groups = _batch()
    adv = group_advantages(scores, groups, norm_by_std=True, eps=1e-6)
    old = plan_step([10] * 16, [4] * 16, 1, 2, 10_000)
    sums = [float(adv[[old.ranks[0].rows[p] for mb in mini for p in mb]].sum()) for mini in old.ranks[0].mini_batches]
    assert sums == pytest.approx([-2.0, 2.0], abs=1e-4)
    new = plan_step([10] * 16, [4] * 16, 1, 2, 10_000, groups=groups)
    assert len(new.ranks[0].mini_batches) == 1  # one group: one optimiser step on all of it
    assert sorted(new.ranks[0].rows) == list(range(16))


def test_a_split_group_lowers_the_correct_answers_after_a_nearly_all_correct_batch():
    before, after_split = _train(by_group=False)
    _, after_group = _train(by_group=True)
    assert after_split < before - 0.01, (before, after_split)   # the shared prefix pushed down
    assert after_group > before + 0.01, (before, after_group)   # the whole group raises it


def test_split_by_group_keeps_groups_whole_and_balances_rows():
    g = ["a"] * 5 + ["b"] * 3 + ["c"] * 4 + ["d"] * 4
    minis = split_by_group(g, 2)
    assert [len(m) for m in minis] == [8, 8]
    for m in minis:
        assert len({g[i] for i in m}) == len({x for x in g if x in {g[i] for i in m}})
    assert sum(minis, []) == list(range(16))
    assert split_by_group(["a"] * 7, 2) == [list(range(7))]
    assert [len(m) for m in split_by_group(["a", "b", "c"], 4)] == [1, 1, 1]
    with pytest.raises(ValueError, match="contiguous"):
        split_by_group(["a", "b", "a"], 2)


def test_shipped_algorithms_plan_by_group():
    assert algo("grpo_plus").mini_batch_by_group and algo("grpo").mini_batch_by_group


def test_plan_by_group_on_two_ranks_trains_every_row_once_within_its_groups_step():
    groups = ["0/a"] * 6 + ["0/b"] * 4 + ["0/c"] * 5
    lengths = [5, 40, 7, 33, 12, 3, 21, 9, 9, 30, 8, 14, 6, 25, 11]
    plan = plan_step(lengths, [1] * len(lengths), world_size=2, n_mini=2, token_budget=40, groups=groups)
    seen = {}
    for r in plan.ranks:
        assert len(r.mini_batches) == 2
        for m, mini in enumerate(r.mini_batches):
            for micro in mini:
                for p in micro:
                    if not r.filler[p]:
                        seen.setdefault(r.rows[p], set()).add(m)
    assert sorted(seen) == list(range(len(lengths)))  # each row once
    step_of = {g: {m for i, x in enumerate(groups) if x == g for m in seen[i]} for g in set(groups)}
    assert all(len(s) == 1 for s in step_of.values()), step_of  # a group in one optimiser step
