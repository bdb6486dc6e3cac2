"""The answer corpus (rewards/corpus): its shape, its rules, and each answer's verdict in the real sandbox.

Every answer's shape, rules and parser round trip are checked here. The sandbox verdicts cost a
C++ build each (~18 CPU s with a precompiled header, ~36 without), so CI checks every variant of
``CI_TASKS`` (two tasks on one flag set: one precompiled header serves their fast, wrong and
broken builds) and ``CORPUS_ALL=1`` checks every task (48 cpu answers, ~1000 CPU s on the 2-core
box: what the corpus was verified with). The triton answers run in the interpreter (no compiler;
the same tasks), cuda and triton at full sizes on a GPU (``gpu`` mark: all tasks).
"""
from __future__ import annotations

import ast
import asyncio
import os
import statistics
from collections import Counter

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
from sandbox.pool import SandboxPool

# L1/19_silu: the laptop default's task, so tests/pipeline/test_laptop_learns.py and these share its
# builds through the session's compile cache
CI_TASKS = ("L1/19_silu", "L2/9_scale_shift_tanh_residual")
ALL = os.environ.get("CORPUS_ALL") == "1"
CPU_ANSWERS = corpus_answers("cpu", None if ALL else CI_TASKS)
TRITON_ANSWERS = corpus_answers("triton", None if ALL else CI_TASKS)


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


def evaluate_all(backend: str, answers: list[CorpusAnswer], reward: str = "kernel",
                 **sandbox) -> dict[tuple[str, str], object]:
    """Every answer through KernelEnv and a real SandboxPool, concurrently; (task, variant) -> outcome."""
    async def run():
        env = KernelEnv(load_reward_config(reward, backend=backend, holdout_frac=0.0),
                        SandboxPool(load_default_config(**sandbox)))
        refs = {t.task_id: t for t in env.tasks("train")}
        async def one(a: CorpusAnswer):  # a line as each verdict comes (seen with -s; a cut run keeps them)
            o = await env.score(refs[a.task_id], reply(a))
            print(f"[corpus] {backend} {a.task_id} {a.variant}: expected {a.expected}, got {verdict(o)}, "
                  f"speedup {o.speedup}", flush=True)
            return o

        try:
            outcomes = await asyncio.gather(*(one(a) for a in answers))
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
    uses = Counter(tuple(extra_cflags(a.code)) for a in CPU_ANSWERS)
    assert all(pch_allowed(list(f)) for f in uses), uses  # else every build pays for the full header
    for flags, n in sorted(uses.items()):
        if n >= 4:  # a header (~60 CPU s) saves ~19 CPU s per build: what the pool builds after two uses,
            build_pch(f"{kernel_cache_dir}/pch", list(flags))  # built before the first
    return evaluate_all("cpu", CPU_ANSWERS, cache_dir=kernel_cache_dir, precompiled_header=True, compile_workers=2)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first one waits for the module's builds (~320 CPU s; 600 s was not enough at load 16)
@pytest.mark.parametrize("answer", CPU_ANSWERS, ids=lambda a: f"{a.task_id}-{a.variant}")
def test_cpu_answer_gets_its_verdict(cpu_outcomes, answer):
    outcome = cpu_outcomes[(answer.task_id, answer.variant)]
    assert verdict(outcome) == answer.expected, outcome.feedback
    if answer.expected == "correct":
        assert outcome.score > 0.3 and outcome.speedup is not None
    else:
        assert outcome.score == 0.0


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="not yet true through the sandbox: a fresh-clone CI run on the quiet "
                   "2-core box (2026-12-04) gave fast/slow speedup ratios 0.19 (L1/18_gelu), 0.42 "
                   "(L1/20_tanh, then in the CI set), 4.08 (L2/9), although slow is 7-190x slower in process; the cpu "
                   "sizes' calls are too short for the sandbox's timing to separate them (docs/rewards.md)")
def test_cpu_slow_answers_are_slower_than_fast(cpu_outcomes):
    """In process, slow is 7-190x slower than fast at cpu sizes (docs/rewards.md); the sandbox's
    speedups must show it. Every task but one: timings on a busy 2-core box are noisy."""
    tasks = sorted({a.task_id for a in CPU_ANSWERS})
    ratios = {t: cpu_outcomes[(t, "fast")].speedup / cpu_outcomes[(t, "slow")].speedup for t in tasks}
    print({t: round(r, 2) for t, r in ratios.items()})
    assert sum(r > 1.0 for r in ratios.values()) >= len(ratios) - 1, ratios
    assert statistics.median(ratios.values()) > 1.5, ratios


# --- triton in the interpreter (no compiler: correctness only) -----------------------------------

@pytest.mark.triton_interpreter
def test_triton_answers_get_their_verdicts_in_the_interpreter(kernel_cache_dir):
    outcomes = evaluate_all("triton", TRITON_ANSWERS, cache_dir=kernel_cache_dir, correctness_trials=3)
    for a in TRITON_ANSWERS:
        o = outcomes[(a.task_id, a.variant)]
        assert verdict(o) == a.expected, (a.task_id, a.variant, o.feedback)


# --- cuda and triton on a GPU ---------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gpu_answers_get_their_verdicts_and_slow_is_slower(backend, tmp_path):
    answers = corpus_answers(backend)
    # CORPUS_ONLY="task:variant,...": just those (finishing a run a device call's limit cut short)
    only = {tuple(x.split(":")) for x in os.environ.get("CORPUS_ONLY", "").split(",") if x}
    answers = [a for a in answers if not only or (a.task_id, a.variant) in only]
    workers = max(2, (os.cpu_count() or 4) // 2)  # the H200 host has 16 cores: 48 nvcc builds in minutes
    outcomes = evaluate_all(backend, answers, f"kernel_{backend}", cache_dir=str(tmp_path),  # full sizes
                            compile_workers=workers, max_concurrent=16)
    for a in answers:  # the table the lead copies into docs (run with -s)
        o = outcomes[(a.task_id, a.variant)]
        print(f"{backend} {a.task_id:36s} {a.variant:6s} expected={a.expected:13s} got={verdict(o):13s} "
              f"speedup={o.speedup}")
    bad = {(a.task_id, a.variant): (verdict(o), o.feedback[:300])
           for a in answers for o in [outcomes[(a.task_id, a.variant)]] if verdict(o) != a.expected}
    assert not bad, bad
    pairs = {t: (outcomes[(t, "fast")].speedup, outcomes[(t, "slow")].speedup)
             for t in corpus_tasks(backend) if (t, "slow") in outcomes and (t, "fast") in outcomes}
    slower = {t: p for t, p in pairs.items() if not p[1] < p[0]}
    assert not slower, slower
