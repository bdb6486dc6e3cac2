"""A learnable logit table trained with the real algorithm (returns, group advantages, filters,
train batch, clipped loss, two mini-batches per batch) improves a toy reward."""
import time

import torch
import verl.trainer.ppo.core_algos  # noqa: F401  (imported at collection: the timed loop excludes it)

from pipeline.algorithms import build_train_batch, policy_loss
from pipeline.sample import Sample
from tests.pipeline.algorithms.conftest import algo

VOCAB, EOS, A, MAX_LEN = 5, 4, 0, 6   # reward: share of token A among the generated tokens


class TablePolicy(torch.nn.Module):
    """Position-dependent logits, no context: log pi(token | position)."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(MAX_LEN, VOCAB))

    def log_probs(self, tokens: torch.Tensor) -> torch.Tensor:
        r = tokens.shape[1]
        return torch.log_softmax(self.logits[:r], -1)[torch.arange(r)[None], tokens]

    @torch.no_grad()
    def generate(self, n: int, g: torch.Generator) -> list[tuple[list[int], list[float], str]]:
        """n independent responses, each cut after its first EOS."""
        logp = torch.log_softmax(self.logits, -1)
        toks = torch.multinomial(logp.exp(), n, replacement=True, generator=g).T  # [n, MAX_LEN]
        lps = logp[torch.arange(MAX_LEN)[None], toks]
        out = []
        for row, lp in zip(toks.tolist(), lps.tolist()):
            end = row.index(EOS) + 1 if EOS in row else MAX_LEN
            out.append((row[:end], lp[:end], "stop" if end <= len(row) and row[end - 1] == EOS else "length"))
        return out


def score(tokens: list[int]) -> float:
    body = [t for t in tokens if t != EOS]
    return sum(t == A for t in body) / len(body) if body else 0.0


def rollout(policy, step, g, tasks=4, trajs=8, turns=2) -> list[Sample]:
    samples = []
    responses = iter(policy.generate(tasks * trajs * turns, g))
    for t in range(tasks):
        for j in range(trajs):
            for turn in range(turns):
                resp, lps, finish = next(responses)
                samples.append(Sample(uid=f"{step}/{t}/{j}/{turn}", step=step, task_id=f"task{t}", traj=j,
                                      turn=turn, prompt_ids=[1, 2, t], response_ids=resp, logprobs=lps,
                                      finish_reason=finish, score=score(resp), policy_version=step))
    return samples


def train_step(policy, opt, batch, cfg) -> None:
    P = batch.prompt_len
    tokens = batch.input_ids[:, P:]
    with torch.no_grad():
        old = policy.log_probs(tokens)
    n = len(batch)
    minis = [list(range(0, n // 2)), list(range(n // 2, n))]
    for rows in minis:
        idx = torch.tensor(rows)
        loss, _ = policy_loss(old[idx], policy.log_probs(tokens[idx]), batch.advantages[idx],
                              batch.response_mask[idx], cfg, MAX_LEN)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        opt.step()


def mean_reward(samples):
    return sum(s.score for s in samples) / len(samples)


def test_table_policy_learns_the_toy_reward():
    t0 = time.perf_counter()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    cfg = algo(grad_clip=1.0)
    policy = TablePolicy()
    opt = torch.optim.Adam(policy.parameters(), lr=0.1)
    before = mean_reward(rollout(policy, -1, g, tasks=8))
    rows = []
    for step in range(15):
        batch = build_train_batch(rollout(policy, step, g), cfg, MAX_LEN, pad_token_id=EOS)
        rows.append(len(batch))
        if len(batch):
            train_step(policy, opt, batch, cfg)
    after = mean_reward(rollout(policy, 99, g, tasks=8))
    print(f"mean reward {before:.3f} -> {after:.3f}")
    assert before < 0.35, before
    assert after > before + 0.4, (before, after)
    assert min(rows) > 0  # every step had something to train on
    assert time.perf_counter() - t0 < 20
