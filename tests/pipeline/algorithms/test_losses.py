import math

import pytest
import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
from verl.workers.config import ActorConfig

from pipeline.algorithms import policy_loss, tis_weights
from pipeline.trainer.plan import micro_weight
from tests.pipeline.algorithms.conftest import algo

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]


def clip_case():
    # (ratio, advantage) per token; eps_low 0.2, eps_high 0.28
    ratio = torch.tensor([[1.5, 1.1, 0.5], [1.5, 0.5, 0.9]])
    adv = torch.tensor([[1.0, 1.0, -1.0], [-1.0, 1.0, -1.0]])
    return torch.zeros(2, 3), ratio.log(), adv, torch.ones(2, 3)


def test_clipping_on_both_sides_by_hand():
    old, new, adv, mask = clip_case()
    new.requires_grad_(True)
    loss, m = policy_loss(old, new, adv, mask, algo(loss_agg_mode="token-mean"), None)
    # tokens: -1.28 (clipped high), -1.1, 0.8 (clipped low), 1.5, -0.5, 0.9
    assert loss.item() == pytest.approx((-1.28 - 1.1 + 0.8 + 1.5 - 0.5 + 0.9) / 6, abs=1e-6)
    assert m["actor/pg_clipfrac_high"] == pytest.approx(1 / 6)
    assert m["actor/pg_clipfrac_low"] == pytest.approx(1 / 6)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 6)
    assert m["actor/ppo_kl"] == pytest.approx(-new.detach().mean().item(), abs=1e-6)
    loss.backward()
    clipped = torch.tensor([[True, False, True], [False, False, False]])
    assert (new.grad[clipped] == 0).all() and (new.grad[~clipped] != 0).all()


def test_dual_clip_bounds_negative_advantage_losses():
    old, new, adv = torch.zeros(1, 1), torch.tensor([[math.log(4.0)]]), torch.tensor([[-1.0]])
    mask = torch.ones(1, 1)
    off, _ = policy_loss(old, new, adv, mask, algo(loss_agg_mode="token-mean"), None)
    on, m = policy_loss(old, new, adv, mask, algo(loss_agg_mode="token-mean", clip_ratio_c=3.0), None)
    assert off.item() == pytest.approx(4.0) and on.item() == pytest.approx(3.0)
    assert m["actor/pg_clipfrac_lower"] == 1.0


@pytest.mark.parametrize("mode,want", [("token-mean", -0.25), ("token-sum", -1.0),
                                       ("seq-mean-token-sum", -0.5), ("seq-mean-token-sum-norm", -0.05),
                                       ("seq-mean-token-mean", 0.5)])
def test_each_aggregation_mode_by_hand(mode, want):
    adv = torch.tensor([[1.0] * 3, [-2.0] * 3, [5.0] * 3])  # ratio 1: token loss = -advantage
    mask = torch.tensor([[1.0, 1, 1], [1, 0, 0], [0, 0, 0]])  # the last row is fully masked
    lp = torch.zeros(3, 3)
    loss, _ = policy_loss(lp, lp, adv, mask, algo(loss_agg_mode=mode), 10)
    assert loss.item() == pytest.approx(want)


def test_norm_mode_needs_a_constant_scale_factor():
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        policy_loss(lp, lp, lp, torch.ones(1, 2), algo(), None)


def random_case(seed, b=7, r=9):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, r, generator=g) * 3
    new = old + torch.randn(b, r, generator=g) * 0.4
    adv = torch.randn(b, 1, generator=g).expand(b, r).clone()
    lens = torch.randint(0, r + 1, (b,), generator=g)
    mask = (torch.arange(r)[None] < lens[:, None]).float()
    isw = torch.rand(b, r, generator=g) * 2
    return old, new, adv, mask, isw


@pytest.mark.parametrize("mode", MODES)
def test_parity_with_verl_vanilla_loss(mode):
    old, new, adv, mask, isw = random_case(3)
    cfg = algo(loss_agg_mode=mode, clip_ratio_c=3.0)
    verl_cfg = ActorConfig(strategy="fsdp", clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28,
                           clip_ratio_c=3.0, loss_agg_mode=mode, ppo_micro_batch_size_per_gpu=1, rollout_n=1)
    verl_cfg.global_batch_info["loss_scale_factor"] = 16
    for w in (None, isw):
        ours, m = policy_loss(old, new, adv, mask, cfg, 16, rollout_is_weights=w)
        theirs, vm = compute_policy_loss_vanilla(old, new, adv, mask, mode, verl_cfg, rollout_is_weights=w)
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
        assert m["actor/ppo_kl"] == pytest.approx(vm["actor/ppo_kl"], abs=1e-6)
        assert m["actor/pg_clipfrac_high"] + m["actor/pg_clipfrac_low"] == pytest.approx(
            vm["actor/pg_clipfrac"], abs=1e-6)


def test_kl_and_entropy_terms_only_when_their_coefficients_are_positive():
    old, new, adv, mask, _ = random_case(4)
    ent = torch.full_like(new, 2.0)
    ref = new - 0.1
    base, m = policy_loss(old, new, adv, mask, algo(loss_agg_mode="token-mean"), None, entropy=ent, ref_log_prob=ref)
    assert m["actor/entropy"] == pytest.approx(2.0) and "actor/kl_loss" not in m
    with_ent, _ = policy_loss(old, new, adv, mask, algo(loss_agg_mode="token-mean", entropy_coeff=0.01),
                              None, entropy=ent)
    assert with_ent.item() == pytest.approx(base.item() - 0.02, abs=1e-6)
    with_kl, mk = policy_loss(old, new, adv, mask, algo(loss_agg_mode="token-mean", kl_coef=0.5, kl_type="k1"),
                              None, ref_log_prob=ref)
    assert mk["actor/kl_loss"] == pytest.approx(0.1, abs=1e-6)  # k1 = log pi - log ref = 0.1
    assert with_kl.item() == pytest.approx(base.item() + 0.05, abs=1e-6)
    with pytest.raises(ValueError, match="kl_coef"):
        policy_loss(old, new, adv, mask, algo(kl_coef=0.5), 16)


def test_tis_weights_by_hand():
    old = torch.tensor([[math.log(3.0), math.log(0.5), 0.0]])
    w = tis_weights(old, torch.zeros(1, 3), 2.0, torch.tensor([[1.0, 1.0, 0.0]]))
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 0.0]]))
    assert not w.requires_grad


# ---- gradient accumulation: micro-batches add up to the whole batch ---------------------------
def logit_table_case(seed=5, b=8, r=10, vocab=6):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(r, vocab, generator=g, requires_grad=True)
    tokens = torch.randint(0, vocab, (b, r), generator=g)
    lens = torch.tensor([10, 3, 7, 1, 0, 9, 4, 6])  # row 4 has no loss tokens (filtered)
    mask = (torch.arange(r)[None] < lens[:, None]).float()
    with torch.no_grad():
        old = torch.log_softmax(table, -1)[torch.arange(r)[None], tokens] + torch.randn(b, r, generator=g) * 0.3
    adv = torch.randn(b, 1, generator=g).expand(b, r).clone()
    return table, tokens, mask, old, adv


def grad_of(table, tokens, mask, old, adv, rows, cfg, scale, weight=1.0):
    """Gradient of one micro-batch, trimmed to its own longest response like the trainer does."""
    idx = torch.tensor(rows)
    width = max(1, int(mask[idx].sum(1).max()))
    logp = torch.log_softmax(table, -1)[torch.arange(width)[None], tokens[idx, :width]]
    loss, _ = policy_loss(old[idx, :width], logp, adv[idx, :width], mask[idx, :width], cfg,
                          scale if scale is not None else width)
    table.grad = None
    (loss * weight).backward()
    return table.grad.clone()


@pytest.mark.parametrize("mode", MODES)
def test_micro_batch_gradients_sum_to_the_batch_gradient(mode):
    table, tokens, mask, old, adv = logit_table_case()
    cfg = algo(loss_agg_mode=mode)
    full = grad_of(table, tokens, mask, old, adv, list(range(8)), cfg, 10)
    micros = [[0, 1], [2, 3, 4], [5], [6, 7]]
    seqs_total, toks_total = int((mask.sum(1) > 0).sum()), int(mask.sum())
    acc = torch.zeros_like(full)
    for rows in micros:
        m = mask[torch.tensor(rows)]
        w = micro_weight(mode, int((m.sum(1) > 0).sum()), int(m.sum()), seqs_total, toks_total)
        if mode.startswith("seq-mean"):  # the documented contract: its sequences / all sequences
            assert w == int((m.sum(1) > 0).sum()) / seqs_total
        acc += grad_of(table, tokens, mask, old, adv, rows, cfg, 10, w)
    assert full.abs().max() > 1e-3
    torch.testing.assert_close(acc, full, atol=1e-6, rtol=0)


def test_without_a_constant_scale_factor_accumulation_is_wrong():
    table, tokens, mask, old, adv = logit_table_case()
    cfg = algo(loss_agg_mode="seq-mean-token-sum-norm")
    full = grad_of(table, tokens, mask, old, adv, list(range(8)), cfg, 10)
    acc = torch.zeros_like(full)
    for rows in [[0, 1], [2, 3, 4], [5], [6, 7]]:
        m = mask[torch.tensor(rows)]
        acc += grad_of(table, tokens, mask, old, adv, rows, cfg, None, int((m.sum(1) > 0).sum()) / 7)
    assert (acc - full).abs().max() > 1e-3  # each micro-batch normalised by its own width
