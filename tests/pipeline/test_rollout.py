import asyncio

import pytest

from pipeline.engines.hf import HFEngine
from pipeline.rollout import (Start, build_prompt, fit_prompt, run_episodes, stream_episode_chunks,
                              stream_episodes)
from pipeline.rollout_config import max_response_length, response_length_at
from rewards.interface import Turn
from rewards.toy import ToyEnv

from tests.pipeline.conftest import rollout_cfg


@pytest.fixture
def engine(tiny):
    _, model, tok = tiny
    return HFEngine(model, tok, max_inflight=64, max_batch_size=16, batch_wait_s=0.01)


async def test_multi_turn_episodes_fill_every_sample_field(engine, tiny):
    _, _, tok = tiny
    env = ToyEnv(n_tasks=2)
    cfg = rollout_cfg(n_trajectories=3, turns=2)
    seen = []
    batch = await run_episodes(engine, tok, env, env.tasks("train"), step=5, version=2, cfg=cfg,
                               on_sample=seen.append)
    assert len(batch.samples) == len(seen) == 2 * 3 * 2 and batch.stats.n_errors == 0
    assert len({s.uid for s in seen}) == 12 and seen[0].uid.startswith("5/toy/train/")
    for s in seen:
        assert s.step == 5 and s.policy_version == 0  # the engine's own weights version
        assert s.prompt_ids and s.response_ids and len(s.logprobs) == len(s.response_ids)
        assert len(s.response_ids) <= 12 and s.finish_reason in ("stop", "length")
        assert s.response_text == tok.decode(s.response_ids, skip_special_tokens=True)
        assert s.score == pytest.approx(env.answer_score(s.outcome.answer))
        assert s.outcome.feedback.startswith("Your previous answer scored")
        assert s.t_gen_start <= s.t_gen_end <= s.t_eval_end and s.error is None
    by_traj = {(s.task_id, s.traj): sorted([x for x in seen if (x.task_id, x.traj) == (s.task_id, s.traj)],
                                           key=lambda x: x.turn) for s in seen}
    for first, second in by_traj.values():
        text = tok.decode(second.prompt_ids)
        assert first.outcome.feedback in text and text.startswith(tok.decode(first.prompt_ids)[:40])
        assert second.t_gen_start >= first.t_eval_end  # the next turn waits for its own feedback
    m = batch.stats.metrics()
    assert m["rollout/samples"] == 12 and m["timing_s/gen"] > 0 and m["response_length/mean"] > 0


async def test_a_batch_templates_each_distinct_prompt_once(engine, tiny):
    """A task's first turn is one prompt for all its trajectories: templated and tokenized once per
    batch, and each Sample still owns its list; later turns (their own feedback) are templated
    each."""
    _, _, tok = tiny
    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tok, name)

        def __call__(self, *a, **kw):
            return tok(*a, **kw)

        def apply_chat_template(self, messages, **kw):
            calls.append(len(messages))
            return tok.apply_chat_template(messages, **kw)

    env = ToyEnv(n_tasks=2)
    batch = await run_episodes(engine, Counting(), env, env.tasks("train"), step=0, version=0,
                               cfg=rollout_cfg(n_trajectories=4, turns=2))
    first = [s for s in batch.samples if s.turn == 0]
    assert len(first) == 8 and len(batch.samples) == 16
    assert len(calls) == 2 + 8  # 2 tasks' first prompts, then each trajectory's second
    by_task = {}
    for s in first:
        by_task.setdefault(s.task_id, []).append(s.prompt_ids)
    for lists in by_task.values():
        assert all(ids == lists[0] and ids is not lists[0] for ids in lists[1:])
    assert first[0].prompt_ids == build_prompt(tok, env.messages(env.tasks("train")[0], []))


def test_later_prompts_keep_feedback_summary_and_answer_not_the_reasoning(tiny):
    _, _, tok = tiny
    env = ToyEnv()
    task = env.tasks("train")[0]
    response = "<think>\nOkay, SECRET-REASONING here.\n</think>\nSummary: wrote many a\naaaa bbb"
    outcome = asyncio.run(env.score(task, response))
    assert outcome.summary == "wrote many a" and outcome.answer == "aaaa bbb"
    ids, dropped = fit_prompt(tok, env, task, [Turn(outcome.summary, outcome.answer, outcome.feedback)],
                              max_len=4096)
    text = tok.decode(ids)
    assert dropped == 0 and "SECRET-REASONING" not in text and "<think>" not in text
    assert outcome.feedback in text and "aaaa bbb" in text and "wrote many a" in text
    assert text.endswith("<|im_start|>assistant\n")


async def test_streaming_rewards_overlap_generation(tiny):
    _, model, tok = tiny
    # small batches so generation of later trajectories is still running when early ones are scored
    engine = HFEngine(model, tok, max_inflight=64, max_batch_size=2, batch_wait_s=0.0)
    env = ToyEnv(n_tasks=2, delay_s=0.4)
    cfg = rollout_cfg(n_trajectories=4, turns=2, max_response_length=16)
    samples = [s async for s in stream_episodes(engine, tok, env, env.tasks("train"), 0, 0, cfg)]
    assert len(samples) == 16
    assert [s.t_eval_end for s in samples] == sorted(s.t_eval_end for s in samples)  # score order
    first_score = min(s.t_eval_end for s in samples)
    last_token = max(s.t_gen_end for s in samples)
    assert first_score < last_token
    # some trajectory finished generating while another one was being evaluated
    assert any(a.t_gen_end < b.t_gen_end < a.t_eval_end for a in samples for b in samples)
    # evaluations ran concurrently: far less than 16 sequential 0.4 s delays
    assert max(s.t_eval_end for s in samples) - min(s.t_gen_start for s in samples) < 16 * 0.4 / 2


async def test_chunks_hand_over_an_engine_batch_at_once(tiny):
    """Samples scored together travel as one item (a Ray stream pays a round trip per item), up to
    max_chunk; a sample scored alone still goes out at once."""
    _, model, tok = tiny
    engine = HFEngine(model, tok, max_inflight=64, max_batch_size=16, batch_wait_s=0.01)
    env = ToyEnv(n_tasks=2)
    cfg = rollout_cfg(n_trajectories=4, turns=1)
    chunks = [c async for c in stream_episode_chunks(engine, tok, env, env.tasks("train"), 0, 0, cfg)]
    assert engine.stats()["batches"] == 1  # all 8 requests in one engine batch ...
    assert [len(c) for c in chunks] == [8]  # ... so all 8 samples in one item
    capped = [c async for c in stream_episode_chunks(engine, tok, env, env.tasks("train"), 1, 0, cfg,
                                                     max_chunk=3)]
    assert [len(c) for c in capped] == [3, 3, 2]
    assert len({s.uid for c in capped for s in c}) == 8

    # batches of one run one after the other: the first sample goes out before the second exists
    one_by_one = HFEngine(model, tok, max_inflight=64, max_batch_size=1, batch_wait_s=0.0)
    alone = [c async for c in stream_episode_chunks(one_by_one, tok, env, env.tasks("train")[:1], 0, 0,
                                                    rollout_cfg(n_trajectories=2, turns=1))]
    assert [len(c) for c in alone] == [1, 1]


class CrashingEnv(ToyEnv):
    """An evaluator that dies on one task: its trajectories stop, the batch completes."""

    async def score(self, task, response):
        if task.task_id.endswith("/1"):
            raise RuntimeError("evaluator process died")
        return await super().score(task, response)


async def test_evaluator_crash_gives_zero_scored_samples_and_the_batch_completes(engine, tiny):
    _, _, tok = tiny
    env = CrashingEnv(n_tasks=2)
    batch = await run_episodes(engine, tok, env, env.tasks("train"), 0, 0, rollout_cfg(turns=3))
    bad = [s for s in batch.samples if s.task_id.endswith("/1")]
    good = [s for s in batch.samples if s.task_id.endswith("/0")]
    assert len(good) == 2 * 3 and all(s.error is None for s in good)
    assert len(bad) == 2 and all(s.turn == 0 and s.score == 0.0 for s in bad)
    assert all("evaluation failed: RuntimeError: evaluator process died" in s.error for s in bad)
    assert all(s.response_ids for s in bad)  # the generated tokens are kept with the error
    assert all(s.outcome.error_kind == "pipeline_error" and not s.outcome.parse_ok for s in bad)
    assert batch.stats.n_errors == 2


async def test_timeouts_become_error_samples(engine, tiny):
    _, _, tok = tiny
    slow = ToyEnv(n_tasks=1, delay_s=5.0)
    batch = await run_episodes(engine, tok, slow, slow.tasks("train"), 0, 0, rollout_cfg(score_timeout_s=0.2))
    assert len(batch.samples) == 2 and all("evaluation timed out" in s.error for s in batch.samples)
    env = ToyEnv(n_tasks=1)
    batch = await run_episodes(engine, tok, env, env.tasks("train"), 0, 0, rollout_cfg(gen_timeout_s=1e-4))
    assert len(batch.samples) == 2
    assert all(s.finish_reason == "error" and "generation timed out" in s.error and s.score == 0
               for s in batch.samples)


async def test_an_engine_error_ends_the_trajectory_with_a_reason(tiny):
    _, model, tok = tiny
    engine = HFEngine(model, tok)
    engine.sleep()  # every generate now fails with EngineAsleep
    env = ToyEnv(n_tasks=1)
    batch = await run_episodes(engine, tok, env, env.tasks("train"), 0, 0, rollout_cfg())
    assert len(batch.samples) == 2 and all("EngineAsleep" in s.error and s.score == 0
                                           for s in batch.samples)
    assert env.evaluations == 0


async def test_long_prompts_drop_old_turns_or_end_the_trajectory(engine, tiny):
    _, _, tok = tiny
    env = ToyEnv(n_tasks=1)
    task = env.tasks("train")[0]
    first = len(build_prompt(tok, env.messages(task, [])))
    cfg = rollout_cfg(turns=3, max_prompt_length=first + 8)  # no room for an earlier turn
    batch = await run_episodes(engine, tok, env, [task], 0, 0, cfg)
    assert len(batch.samples) == 6 and all(len(s.prompt_ids) <= first + 8 for s in batch.samples)
    assert batch.stats.history_turns_dropped > 0
    assert all(s.history_dropped >= 1 for s in batch.samples if s.turn > 0)
    batch = await run_episodes(engine, tok, env, [task], 0, 0, rollout_cfg(max_prompt_length=first - 1))
    assert batch.samples == [] and batch.stats.ended_prompt_too_long == 2


async def test_a_start_continues_a_trajectory_from_its_history(engine, tiny):
    """Test-time search: a trajectory opens on a given history, its turn ids go on from first_turn."""
    _, _, tok = tiny
    env = ToyEnv(n_tasks=1)
    task = env.tasks("train")[0]
    history = [Turn("wrote a", "aaa b", "Your previous answer scored 0.750 (share of 'a')."),
               Turn("", "bb", "Your previous answer scored 0.000 (share of 'a').")]
    start = Start(history, first_turn=4, round=2, parent=1)
    batch = await run_episodes(engine, tok, env, [task], 0, 0, rollout_cfg(),
                               starts={(task.task_id, 1): start})
    cont = sorted((s for s in batch.samples if s.traj == 1), key=lambda s: s.turn)
    fresh = sorted((s for s in batch.samples if s.traj == 0), key=lambda s: s.turn)
    assert [s.turn for s in cont] == [4, 5] and [s.turn for s in fresh] == [0, 1]
    assert cont[0].uid == f"0/{task.task_id}/1/4"
    assert all((s.round, s.parent) == (2, 1) for s in cont)
    assert all((s.round, s.parent) == (0, None) for s in fresh)
    assert cont[0].prompt_ids == build_prompt(tok, env.messages(task, history))
    assert history[0].feedback in tok.decode(cont[1].prompt_ids)
    assert cont[0].outcome.feedback in tok.decode(cont[1].prompt_ids)
    assert fresh[0].prompt_ids == build_prompt(tok, env.messages(task, []))
    assert Start(history).turn0 == 2
    with pytest.raises(ValueError, match="starts for trajectories not in this batch"):
        await run_episodes(engine, tok, env, [task], 0, 0, rollout_cfg(), starts={("nope", 0): start})


def test_response_length_schedule():
    cfg = rollout_cfg(max_response_length=16384, response_length_schedule=[[0, 16384], [30, 22528]])
    assert [response_length_at(cfg, s) for s in (0, 29, 30, 99)] == [16384, 16384, 22528, 22528]
    assert max_response_length(cfg) == 22528
    with pytest.raises(ValueError, match="response_length_schedule"):
        response_length_at(rollout_cfg(response_length_schedule=[[30, 8], [0, 16]]), 0)


async def test_a_push_mid_episode_lands_between_turns_and_each_turn_records_its_version(engine, tiny):
    """pipeline.partial_rollout=true on the HF engine ("wait for the turn to end"):
    weights loaded while episodes run reach the engine under its batch lock, so no turn mixes two
    versions, and a trajectory's later turns report the newer one."""
    _, model, tok = tiny
    env = ToyEnv(n_tasks=2)
    cfg = rollout_cfg(n_trajectories=3, turns=3)
    weights = [(n, p.detach().clone()) for n, p in model.named_parameters()]
    seen = []

    async def push_after_first_turns():
        while not any(s.turn == 0 for s in seen):
            await asyncio.sleep(0.001)
        await asyncio.to_thread(engine.load_weights, weights, 1)  # same values, new version

    pusher = asyncio.create_task(push_after_first_turns())
    await run_episodes(engine, tok, env, env.tasks("train"), step=0, version=0, cfg=cfg,
                       on_sample=seen.append)
    await pusher
    assert {s.policy_version for s in seen} == {0, 1}
    for task_id, traj in {(s.task_id, s.traj) for s in seen}:
        versions = [s.policy_version for s in sorted(seen, key=lambda x: x.turn)
                    if (s.task_id, s.traj) == (task_id, traj)]
        assert versions == sorted(versions)  # never back to an older version
    assert any(s.policy_version == 1 for s in seen if s.turn == 2)


def _pending_at(samples, t):
    """Answers handed to the evaluator and not yet scored at time ``t``."""
    return sum(1 for s in samples if s.t_gen_end < t < s.t_eval_end)


class OneAtATimeEnv(ToyEnv):
    """An evaluator that scores one answer at a time (a sandbox pool with one slot): answers
    handed over together queue behind each other, as cold builds do behind a pool's workers."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.slot = asyncio.Semaphore(1)

    async def score(self, task, response):
        async with self.slot:
            return await super().score(task, response)


async def test_back_pressure_holds_generation_while_the_evaluator_has_a_backlog(tiny):
    """max_pending_scores=2: no generation starts while two answers await their score, the batch
    still completes, and the step reports the backlog and the time waited; off (0), generations
    start whatever the backlog (here up to 8 at once)."""
    _, model, tok = tiny
    env = OneAtATimeEnv(n_tasks=2, delay_s=0.1)
    results = {}
    for limit in (0, 2):
        engine = HFEngine(model, tok, max_inflight=64, max_batch_size=8, batch_wait_s=0.01)
        cfg = rollout_cfg(n_trajectories=4, turns=2, max_response_length=8, max_pending_scores=limit)
        batch = await run_episodes(engine, tok, env, env.tasks("train"), 0, 0, cfg)
        assert len(batch.samples) == 16 and batch.stats.n_errors == 0
        results[limit] = batch
    free, held = results[0], results[2]
    assert max(_pending_at(free.samples, s.t_gen_start) for s in free.samples) >= 4
    assert free.stats.gen_throttled_s == 0 and free.stats.pending_scores_max == 8
    # with the gate, a generation starts only when fewer than 2 answers are pending
    assert max(_pending_at(held.samples, s.t_gen_start) for s in held.samples) < 2
    m = held.stats.metrics()
    assert m["rollout/gen_throttled_s"] > 0.3 and m["rollout/pending_scores_max"] >= 2
    assert 1 <= m["rollout/pending_scores_at_gen_end"] <= 8
