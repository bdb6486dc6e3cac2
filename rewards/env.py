"""KernelEnv: the kernel-writing environment behind :class:`rewards.interface.RewardEnv`.

score = parse -> anti-hack rules -> sandbox (``await pool.evaluate(ref_src, code, backend)``)
-> score -> feedback. Bad model output never raises: every failure is a scored (0) outcome with
its reason. Every outcome leaves through :meth:`KernelEnv.score`, where its text (feedback,
verdict, summary, answer) is scrubbed of secrets (:mod:`rewards.scrub`); the sandbox's own text
(error, log tail) is scrubbed and cut before feedback is built from it. A violation the sandbox
caught at run time on an answer that passed every static rule (``error_kind`` rule_violation, or
a build the sandbox flagged as refused) is a miss of the rules: it is recorded as ``rule_miss``
(in the verdict's flags and the outcome's hacks). The sandbox pool is
passed in (``KernelEnv(cfg, pool)``) or built from the sandbox config
(``KernelEnv.from_config(reward_cfg, sandbox_cfg)``).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import traceback
from typing import TYPE_CHECKING, Any

from rewards.config import validate
from rewards.feedback import parse_feedback, result_feedback, rules_feedback, runtime_violations
from rewards.interface import TaskRef, Turn, TurnOutcome
from rewards.parse import Parsed, parse_response
from rewards.prompts import build_messages
from rewards.rules import RuleSettings, Violation, check_rules
from rewards.score import score_result
from rewards.scrub import Scrubber, default_scrubber
from rewards.tasks import Task, TaskError, load_builtin, load_kernelbench, split
from rewards.tasks.sizes import resize_tasks
from sandbox.result import REFUSED_BUILD, SandboxResult

if TYPE_CHECKING:
    from rewards.config import RewardConfig
    from sandbox.config import SandboxConfig

log = logging.getLogger(__name__)
SPLITS = ("train", "holdout")
RULE_MISS = "rule_miss"


class KernelEnv:
    def __init__(self, cfg: RewardConfig, eval_pool: Any, scrubber: Scrubber | None = None):
        validate(cfg)
        self.cfg = cfg
        self.pool = eval_pool
        self._scrubber = scrubber  # None: this process's environment (rewards.scrub.default_scrubber)
        self.backend: str = cfg.backend
        if self.backend == "triton" and eval_pool is not None:  # evaluations will run
            _check_interpreter()
        self.enabled_rules = list(cfg.rules.enabled)
        self.rule_settings = RuleSettings.from_config(cfg.rules)
        levels = list(cfg.levels)
        if cfg.tasks == "builtin":
            all_tasks = load_builtin(levels, profile=cfg.profile, skip_invalid=cfg.skip_invalid_tasks)
        else:
            all_tasks = load_kernelbench(cfg.tasks, levels, profile=cfg.profile, skip_invalid=cfg.skip_invalid_tasks)
        if not all_tasks:
            raise ValueError(f"reward.tasks={cfg.tasks!r} levels={levels}: no tasks found")
        all_tasks = resize_tasks(all_tasks, list(cfg.sizes))  # before the GPU fit: it is what runs
        train, holdout = split(all_tasks, cfg.holdout_frac, cfg.split_seed)
        if self.backend in ("cuda", "triton"):
            # after the split: a task this device cannot hold leaves its own split and moves no other
            # task between them (the held-out set does not depend on the GPU)
            kept = {t.id for t in _fitting(all_tasks, cfg.skip_invalid_tasks)}
            all_tasks = [t for t in all_tasks if t.id in kept]
            train, holdout = [t for t in train if t.id in kept], [t for t in holdout if t.id in kept]
        if cfg.task_ids:  # a chosen task set (the laptop default: tasks the answer corpus covers)
            unknown = sorted(set(cfg.task_ids) - {t.id for t in all_tasks})
            if unknown:
                raise ValueError(f"reward.task_ids: {unknown} are not tasks of reward.tasks={cfg.tasks!r} "
                                 f"levels={levels}")
            train = [t for t in train if t.id in set(cfg.task_ids)]
            holdout = [t for t in holdout if t.id in set(cfg.task_ids)]
        if cfg.max_tasks is not None:
            train, holdout = train[:cfg.max_tasks], holdout[:cfg.max_tasks]
        self._splits = {"train": train, "holdout": holdout}
        self._by_id = {t.id: t for t in all_tasks}

    @classmethod
    def from_config(cls, reward_cfg: RewardConfig, sandbox_cfg: SandboxConfig) -> "KernelEnv":
        from sandbox.pool import SandboxPool

        return cls(reward_cfg, SandboxPool(sandbox_cfg))

    # ---- RewardEnv ----
    def tasks(self, split_name: str) -> list[TaskRef]:
        if split_name not in SPLITS:
            raise ValueError(f"KernelEnv split={split_name!r}: expected one of {SPLITS}")
        return [TaskRef(task_id=t.id, payload=t) for t in self._splits[split_name]]

    def task(self, ref: TaskRef | str) -> Task:
        task_id = ref if isinstance(ref, str) else ref.task_id
        if not isinstance(ref, str) and isinstance(ref.payload, Task):
            return ref.payload
        if task_id not in self._by_id:
            raise KeyError(f"unknown task {task_id!r} (this environment has {len(self._by_id)} tasks)")
        return self._by_id[task_id]

    def messages(self, task: TaskRef, history: list[Turn]) -> list[dict[str, str]]:
        return build_messages(self.task(task).source, self.backend, self.enabled_rules, history,
                              bool(self.cfg.worked_example))

    async def score(self, task: TaskRef, response: str) -> TurnOutcome:
        try:
            outcome = await self._score(self.task(task), response)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug here must not lose the sample: score 0 with the reason
            log.error("KernelEnv.score failed for %s: %s", task.task_id,
                      self.scrubber.scrub(traceback.format_exc()))
            outcome = TurnOutcome(score=0.0, feedback="The evaluator failed on this attempt; answer again.",
                                  error_kind="sandbox_error", verdict={"error": f"{type(e).__name__}: {e}"},
                                  metrics=sandbox_metrics(None))
        return self._scrubbed(outcome)

    # ---- secrets ----
    @property
    def scrubber(self) -> Scrubber:
        return self._scrubber if self._scrubber is not None else default_scrubber()

    def _scrubbed(self, outcome: TurnOutcome) -> TurnOutcome:
        """The one way out of this environment: every text of the outcome without secrets."""
        s = self.scrubber
        return dataclasses.replace(outcome, feedback=s.scrub(outcome.feedback), summary=s.scrub(outcome.summary),
                                   answer=s.scrub(outcome.answer), verdict=s.scrub_tree(outcome.verdict))

    def _scrubbed_result(self, result: SandboxResult) -> SandboxResult:
        """The sandbox's text (error, log tail) scrubbed and cut, before feedback is built from it."""
        s, limit = self.scrubber, self.cfg.verdict_text_chars
        return dataclasses.replace(result, error=s.scrub(result.error, limit),
                                   log_tail=s.scrub(result.log_tail, limit))

    def in_flight(self) -> dict[str, float]:
        state = getattr(self.pool, "in_flight", None)  # a pool that runs nothing apart has none
        return state() if state is not None else {}

    async def aclose(self) -> None:
        close = getattr(self.pool, "aclose", None)
        if close is not None:
            await close()

    # ---- steps ----
    def check(self, code: str) -> list[Violation]:
        """Rule violations of an answer's code (valid Python)."""
        return check_rules(code, self.backend, self.enabled_rules, self.rule_settings)

    def _static_checks(self, response: str) -> tuple[Parsed, list[Violation]]:
        parsed = parse_response(response, max_chars=self.cfg.max_answer_chars)
        if parsed.code is None or parsed.error_kind == "syntax_error":
            return parsed, []
        return parsed, self.check(parsed.code)

    async def _score(self, task: Task, response: str) -> TurnOutcome:
        cfg = self.cfg
        # parsing and the AST rules are CPU work: off the event loop, so generation keeps streaming
        parsed, violations = await asyncio.to_thread(self._static_checks, response)
        summary = parsed.summary[:cfg.max_summary_chars]
        answer = parsed.code or ""
        hacks = list(dict.fromkeys(v.rule for v in violations))
        if not parsed.ok or violations:
            feedback = rules_feedback(violations) if violations else parse_feedback(parsed)
            if not parsed.ok and violations and parsed.error_kind != "no_model_new":
                feedback = f"{parse_feedback(parsed)}\n{feedback}"
            return TurnOutcome(score=0.0, feedback=feedback, summary=summary, answer=answer,
                               parse_ok=parsed.ok, hacks=hacks,
                               error_kind=parsed.error_kind if not parsed.ok else "rule_violation",
                               verdict={"parse_error": parsed.error,
                                        "violations": [{"rule": v.rule, "reason": v.reason} for v in violations]},
                               metrics=sandbox_metrics(None))
        result = _runtime_violation(self._scrubbed_result(await self._run(task, parsed.code)))
        hacks: list[str] = []
        if result.error_kind == "rule_violation":  # every static rule passed, yet the sandbox caught it
            result = dataclasses.replace(result, correct=False, flags=list(dict.fromkeys([*result.flags, RULE_MISS])))
            hacks = [RULE_MISS, *runtime_violations(result)]
        breakdown = score_result(result, cfg)
        return TurnOutcome(
            score=breakdown.score,
            feedback=result_feedback(result, cfg.feedback_log_chars, breakdown.score, breakdown.note),
            summary=summary, answer=answer, parse_ok=True, compiled=result.compiled, correct=result.correct,
            speedup=result.speedup, hacks=hacks, error_kind=result.error_kind,
            verdict={**result.to_dict(), "credited_speedup": breakdown.credited_speedup, "score_note": breakdown.note},
            metrics=sandbox_metrics(result), evaluated=True)

    async def _run(self, task: Task, code: str) -> SandboxResult:
        try:
            result = await self.pool.evaluate(task.source, code, self.backend)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("sandbox failed on %s: %s", task.id, self.scrubber.scrub(str(e)))
            return SandboxResult.failure("sandbox_error", f"{type(e).__name__}: {e}", backend=self.backend)
        if isinstance(result, dict):
            result = SandboxResult.from_dict(result)
        return result


def sandbox_metrics(result: SandboxResult | None) -> dict[str, float]:
    """The sandbox/* metrics of one outcome (TurnOutcome.metrics says how the pipeline reduces
    them). Every outcome of this env counts as an evaluation, one the sandbox never ran (a parse or
    rule failure, an evaluator error) as a cache miss without a compile."""
    out = {"sandbox/evals_per_min": 1.0,
           "sandbox/cache_hit_rate": float(bool(result is not None and result.cache_hit))}
    if result is not None and "compile" in result.wall_s:
        out["sandbox/compile_s_p50"] = float(result.wall_s["compile"])
    return out


def _runtime_violation(result: SandboxResult) -> SandboxResult:
    """A build the sandbox's build hook refused (the sandbox flags it :data:`REFUSED_BUILD`) is a
    run-time rule violation, whichever step reported it (compile, load or run)."""
    if result.error_kind in ("compile_error", "load_error", "runtime_error") and REFUSED_BUILD in result.flags:
        return dataclasses.replace(result, error_kind="rule_violation", compiled=False, correct=False)
    return result


def _check_interpreter() -> None:
    """Without a GPU the triton backend is Triton's interpreter; where this install's versions make
    it fail correct answers (sandbox.devices.interpreter_problem), stop here rather than score a
    whole run's answers as evaluator failures."""
    from sandbox import devices

    problem = devices.interpreter_problem()
    if problem and not devices.detect_gpus():
        raise ValueError(f"reward.backend=triton: {problem}")


def _fitting(tasks: list[Task], skip_invalid: bool) -> list[Task]:
    """The tasks that can fit the smallest visible GPU at all (sandbox.footprint); one that cannot
    is a TaskError naming it and the bytes (or, with ``skip_invalid_tasks``, a warning)."""
    from sandbox import footprint

    memory = footprint.device_memory_bytes()
    if not memory:
        return tasks
    kept = []
    for task in tasks:
        try:
            why = footprint.too_big(footprint.measure(task.source, task.path), min(memory))
        except Exception:  # noqa: BLE001 - a task meta cannot run: its check happens in the sandbox
            why = None
        if why is None:
            kept.append(task)
            continue
        err = TaskError(f"{task.id} ({task.path}): {why}")
        if not skip_invalid:
            raise err
        log.warning("skipping task: %s", err)
    return kept


def evaluation_bytes(tasks: list[Task], sandbox_cfg: SandboxConfig) -> dict[str, int | None]:
    """Each task's device memory one GPU evaluation of it may hold at once, by task id: the bytes
    the sandbox admits its first step on (the judge's meta-device footprint,
    ``sandbox.footprint.admission_fields``, through ``sandbox.devices.estimate``: the judge, both
    runners, their CUDA contexts). None where the sandbox has no estimate either (the step then
    runs alone and measures it)."""
    from sandbox import devices, footprint

    out: dict[str, int | None] = {}
    for task in tasks:
        try:
            fields = footprint.admission_fields(footprint.measure(task.source, task.path),
                                                sandbox_cfg.timing_input_sets)
        except Exception:  # noqa: BLE001 - a task meta cannot run: its first step measures it
            fields = None
        out[task.id] = None if fields is None else devices.estimate(fields, sandbox_cfg)
    return out
