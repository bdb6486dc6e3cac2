"""The answer corpus (rewards/corpus): its shape, its rules, and each answer's verdict in the real sandbox.

The cpu verdicts come from KernelEnv + EvalPool (real g++ builds, cpu sizes), every cpu answer
once, in one module-scoped evaluation that shares the session's compile cache. The precompiled
headers for the corpus' flag sets are built first (one g++ run each, then every build of that
set skips parsing torch/extension.h), and the "broken" answers stop at their first error.
cuda and triton answers run on a GPU (``gpu`` mark); triton's also run in the interpreter here.
"""
from __future__ import annotations

import ast
import asyncio
import statistics

import pytest

from rewards.config import load_reward_config
from rewards.corpus import (BACKENDS, VARIANTS, CorpusAnswer, corpus_answer, corpus_answers, corpus_tasks,
                            expected_verdict)
from rewards.env import KernelEnv
from rewards.parse import parse_response
from rewards.rules import RuleSettings, check_rules
from rewards.solutions import available, load_solution
from rewards.tasks import load_builtin
from sandbox.build import build_pch, pch_allowed
from sandbox.config import load_default_config
from sandbox.pool import EvalPool

CPU_ANSWERS = corpus_answers("cpu")
TRITON_ANSWERS = corpus_answers("triton")


def reply(answer: CorpusAnswer) -> str:
    """A response as a model would write it (and as pipeline.sft trains on it)."""
    return f"One kernel.\n```python\n{answer.code}\n```"


def verdict(outcome) -> str:
    return "correct" if outcome.correct else str(outcome.error_kind)


def extra_cflags(code: str) -> list[str] | None:
    """The literal extra_cflags of an answer's load_inline call ([] when it gives none)."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "load_inline":
            for kw in node.keywords:
                if kw.arg == "extra_cflags":
                    return ast.literal_eval(kw.value)
            return []
    return None


def evaluate_all(backend: str, answers: list[CorpusAnswer], **sandbox) -> dict[tuple[str, str], object]:
    async def run():
        env = KernelEnv(load_reward_config("kernel", backend=backend, holdout_frac=0.0),
                        EvalPool(load_default_config(**sandbox)))
        refs = {t.task_id: t for t in env.tasks("train")}
        try:
            outcomes = await asyncio.gather(*(env.evaluate(refs[a.task_id], reply(a)) for a in answers))
        finally:
            await env.aclose()
        return {(a.task_id, a.variant): o for a, o in zip(answers, outcomes)}

    return asyncio.run(run())


# --- the corpus itself (no sandbox) ---------------------------------------------------------------

def test_cpu_corpus_has_twelve_tasks_with_every_variant():
    tasks = corpus_tasks("cpu")
    assert len(tasks) >= 12
    builtin = {t.id for t in load_builtin()}
    for backend in BACKENDS:
        assert set(corpus_tasks(backend)) <= builtin, backend
    for task_id in tasks:
        assert [a.variant for a in corpus_answers("cpu", [task_id])] == list(VARIANTS), task_id


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_answer_is_a_response_code_block_that_passes_the_rules(backend):
    cfg = load_reward_config("kernel")
    settings = RuleSettings.from_config(cfg.rules)
    answers = corpus_answers(backend)
    assert answers
    for a in answers:
        parsed = parse_response(reply(a), max_chars=cfg.max_answer_chars)
        assert parsed.ok and parsed.code == a.code, (a.task_id, a.variant, parsed.error)
        assert a.expected == expected_verdict(backend, a.variant)
        assert check_rules(a.code, backend, cfg.rules.enabled, settings) == [], (a.task_id, a.variant)


def test_variants_of_a_task_differ_and_the_solutions_are_the_fast_answers():
    for backend in BACKENDS:
        assert available(backend) == [t for t in corpus_tasks(backend)
                                      if any(a.variant == "fast" for a in corpus_answers(backend, [t]))]
        for task_id in corpus_tasks(backend):
            codes = [a.code for a in corpus_answers(backend, [task_id])]
            assert len(set(codes)) == len(codes), (backend, task_id)
        for task_id in available(backend):
            assert load_solution(backend, task_id) == corpus_answer(backend, task_id, "fast").code
    # "slow" on cpu is the fast kernel without its optimisation flags (torch builds at -O0)
    for task_id in corpus_tasks("cpu"):
        assert extra_cflags(corpus_answer("cpu", task_id, "slow").code) == []
        assert "-O3" in extra_cflags(corpus_answer("cpu", task_id, "fast").code)


def test_missing_answers_are_named():
    with pytest.raises(KeyError, match="L1/999_nothing"):
        corpus_answers("cpu", ["L1/999_nothing"])
    with pytest.raises(KeyError, match="variants there: fast"):
        corpus_answer("cpu", "L1/17_relu", "fastest")
    with pytest.raises(ValueError, match="backend 'rocm'"):
        corpus_tasks("rocm")
    with pytest.raises(ValueError, match="L<level>/<ID_name>"):
        corpus_answers("cpu", ["17_relu"])


# --- cpu verdicts in the real sandbox -------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu_outcomes(kernel_cache_dir):
    flag_sets = {tuple(extra_cflags(a.code)) for a in CPU_ANSWERS}
    assert all(pch_allowed(list(f)) for f in flag_sets), flag_sets  # else a build pays for the full header
    for flags in sorted(flag_sets):  # what the pool builds after two uses of a set, built before the first
        build_pch(f"{kernel_cache_dir}/pch", list(flags))
    return evaluate_all("cpu", CPU_ANSWERS, cache_dir=kernel_cache_dir, precompiled_header=True, compile_workers=2)


@pytest.mark.slow
@pytest.mark.parametrize("answer", CPU_ANSWERS, ids=lambda a: f"{a.task_id}-{a.variant}")
def test_cpu_answer_gets_its_verdict(cpu_outcomes, answer):
    outcome = cpu_outcomes[(answer.task_id, answer.variant)]
    assert verdict(outcome) == answer.expected, outcome.feedback
    if answer.expected == "correct":
        assert outcome.score > 0.3 and outcome.speedup is not None
    else:
        assert outcome.score == 0.0


@pytest.mark.slow
def test_cpu_slow_answers_are_slower_than_fast(cpu_outcomes):
    ratios = {t: cpu_outcomes[(t, "fast")].speedup / cpu_outcomes[(t, "slow")].speedup for t in corpus_tasks("cpu")}
    print({t: round(r, 2) for t, r in ratios.items()})
    # timings on a shared 2-core box are noisy: most tasks, and the median clearly
    assert sum(r > 1.0 for r in ratios.values()) >= len(ratios) - 2, ratios
    assert statistics.median(ratios.values()) > 1.5, ratios


# --- triton in the interpreter (no compiler: correctness only) -----------------------------------

def test_triton_answers_get_their_verdicts_in_the_interpreter(kernel_cache_dir):
    outcomes = evaluate_all("triton", TRITON_ANSWERS, cache_dir=kernel_cache_dir)
    for a in TRITON_ANSWERS:
        o = outcomes[(a.task_id, a.variant)]
        assert verdict(o) == a.expected, (a.task_id, a.variant, o.feedback)


# --- cuda and triton on a GPU ---------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_answers_get_their_verdicts_and_slow_is_slower(backend, tmp_path):
    answers = corpus_answers(backend)
    outcomes = evaluate_all(backend, answers, cache_dir=str(tmp_path))
    bad = {(a.task_id, a.variant): (verdict(o), o.speedup, o.feedback[:300])
           for a in answers for o in [outcomes[(a.task_id, a.variant)]] if verdict(o) != a.expected}
    speed = {t: {v: outcomes[(t, v)].speedup for v in ("fast", "slow") if (t, v) in outcomes}
             for t in corpus_tasks(backend)}
    print(backend, speed)
    assert not bad, bad
    slower = [t for t, s in speed.items() if len(s) == 2 and s["slow"] >= s["fast"]]
    assert not slower, {t: speed[t] for t in slower}
