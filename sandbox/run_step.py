"""One run step of the judge (docs/sandbox.md, "One run step"): correctness and timing of one
answer, the judge driving the reference and candidate runners call by call."""
from __future__ import annotations

import os
import secrets
import time
from typing import Any

from sandbox import checks, host_poison, share, sweep
from sandbox.footprint import BIG_INPUTS
from sandbox.gate import Gate
from sandbox.input_sets import InputSets
from sandbox.judge import Lost, Runner
from sandbox.limits import call_limit
from sandbox.run_timing import TIMING_CUT, Timing
from sandbox.wire import MARKER, RUNNER_FLAGS, Forged, StepRequest, reported_failure

_perf_counter = time.perf_counter  # captured before any answer exists anywhere near this process
_MAX_POISON = 8 << 30   # NaN-filled memory freed before a candidate call: outputs are usually <= 2x inputs


class RunStep(Timing, InputSets):
    """Correctness and timing of one answer (docs/sandbox.md, "One run step")."""

    def __init__(self, req: StepRequest, gate: Gate | None):
        self.req, self.gate = req, gate
        self.result: dict[str, Any] = {"stage": "correctness", "compiled": False, "wall_s": {}, "flags": []}
        self.measured_ref_ms: float | None = None  # the reference time this step measured (the pool keeps it)
        self._first_call = True  # the answer's first call gets a longer call limit
        self._limit_ref_ms: float | None = None  # the reference call that sized call_limit_s here (_size_call_limit)
        self._poison = 0  # the poison of the candidate's last call (0: none asked)
        self.rng = secrets.SystemRandom()   # which timed calls are checked: nothing a runner can predict
        # the seeds of timed calls' inputs: unpredictable, or an answer could draw the next inputs
        # itself outside the timed windows and answer a timed call from that
        self.seeds = iter(lambda: secrets.randbits(62), None)

    def run(self) -> dict[str, Any]:
        from sandbox import protocol

        req = self.req
        t = _perf_counter()
        self.task = protocol.load_task(req.task_src, req.workdir)
        self.result["wall_s"]["task_load"] = round(_perf_counter() - t, 3)
        # where glibc keeps the allocation poison: the same address in the runners, forks of this process
        self.poison_at = host_poison.locate()
        # both runners before CUDA starts here: a fork after CUDA init breaks CUDA in the child
        self._t_fork = _perf_counter()
        self.ref = Runner.fork("reference", req, self.task)
        self.cand = Runner.fork("candidate", req, self.task)
        try:
            return self._run()
        except Lost as lost:
            self.result.update(correct=False, error_kind=lost.kind, error=lost.message, stage=lost.stage)
            self.result["flags"] = sorted(set(self.result["flags"] + lost.flags))
            return self.result
        finally:
            # The window (shared or exclusive) goes back once no answer code is left: the candidate
            # and whatever it started are killed and reaped first (a process's CUDA context, with
            # any work it queued after its last answer, is torn down before it can be reaped). The
            # reference runner runs trusted code whose every call ended in a device-wide
            # synchronise, so nothing of it is queued: it is killed at once (its teardown overlaps
            # the candidate's) but reaped only after the window is back (docs/sandbox.md, "The
            # device gate").
            t = _perf_counter()
            self.ref.signal_kill()
            self.cand.kill()
            sweep.kill_marked(os.environ.get(MARKER), keep=[self.ref.pid], everything=os.getpid() == 1)
            self._spent("teardown", t)
            if self.gate is not None:
                self.gate.done(self.measured_ref_ms)
                self.gate.close()
            t = _perf_counter()
            self.ref.kill()
            sweep.kill_marked(os.environ.get(MARKER), everything=os.getpid() == 1)
            self._spent("reap", t)

    def _run(self) -> dict[str, Any]:
        from sandbox import protocol

        req, wall = self.req, self.result["wall_s"]
        prep_deadline = time.monotonic() + float(req.timeout_s)
        if req.starts_cuda_early():  # no gate: the GPU is this step's; CUDA starts here as in the runners
            protocol.start_cuda(req.device)
        t = _perf_counter()
        wall["judge_start"] = round(t - self._t_fork, 3)   # the runners forked, CUDA started here where early
        for r in (self.ref, self.cand):
            msg, _ = r.reply("ready", prep_deadline)
            if r is self.cand:  # sent before any answer code was imported there
                if self.poison_at is not None and host_poison.read(r.pid, self.poison_at) is None:
                    self.poison_at = None  # this host's rules keep the judge out: not checkable, said so
                    self.result["host_poison"] = "unchecked: the candidate's memory is not readable to the judge"
                reported = msg.get("isolation")
                self.result["candidate_isolation"] = [m for m in reported if isinstance(m, str)] \
                    if isinstance(reported, list) else []
        # the runners' start (fork, their confinement, CUDA where it starts early), past the judge's own
        wall["runners_ready"] = round(_perf_counter() - t, 3)
        device = None
        if self.gate is not None:
            t = _perf_counter()
            footprint = self._footprint()
            wall["footprint"] = round(_perf_counter() - t, 3)
            waited, device = self.gate.wait(footprint, self._warm)
            wall["device_wait"] = round(waited, 3)
        if device is not None and req.device.startswith("cuda"):
            os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
        self.deadline = time.monotonic() + float(req.timeout_s)
        t = _perf_counter()
        for r in (self.ref, self.cand):  # both load at once: CUDA starts in each
            r._refuse_unasked()
            r.chan.send({"op": "load", "device": device})
        self._loaded(self.ref, "reference_error")
        self._loaded(self.cand, None)
        self.result["compiled"] = True
        wall["load"] = round(_perf_counter() - t, 3)
        t = _perf_counter()
        # the candidate's buffers (the reference maps them too, and uses them only once the candidate
        # is gone), and one the candidate never sees: the reference's output that a check compares
        # with is computed there, on a fresh draw of the same seed (so nothing the answer changes
        # in its buffers, even after the tamper check, can reach the reference's inputs)
        self.sets = [self._make_set(0, [self.cand, self.ref])]
        big = share.nbytes_of(self.sets[0]["values"]) > BIG_INPUTS
        # with inputs of several GiB, one buffer: the device holds it, the check set, a fresh draw
        # and three outputs at once (addresses then repeat; values still never do)
        self.sets += [self._make_set(k, [self.cand, self.ref]) for k in range(1, 1 if big else int(req.timing_input_sets))]
        self.check_set = self._make_set(-1, [self.ref])
        wall["inputs"] = round(_perf_counter() - t, 3)
        if not req.call_limit_s and float(req.call_timeout_ref_factor) > 0:
            t = _perf_counter()
            self._size_call_limit()
            wall["call_limit_ref"] = round(_perf_counter() - t, 3)
        t = _perf_counter()
        self._correctness()
        wall["correctness"] = round(_perf_counter() - t, 3)
        if not req.timed:
            self.result["stage"] = "done"
            return self.result
        self.result["stage"] = "timing"
        if self.gate is not None:
            # the device alone for every timed call, the reference's too; the wait is not run time
            waited = self.gate.exclusive()
            self.deadline += waited
            wall["exclusive_wait"] = round(waited, 3)
        if not req.ref_runtime_ms and (self.gate is None or self.gate.ref_ms is None):
            # no known time bounds a win here: a window of the reference before the answer's too (a
            # burst of other work can cover both windows after it, as on the laptop at a run's first
            # step, 2026-12-08: a ~1x SiLU credited 8.59x against 3.22 ms where quiet calls take 0.36)
            wall["ref_before_ms"] = round(self._time(self.ref, check=False)[0], 6)
        t = _perf_counter()
        new_ms, spread = self._time(self.cand, check=True)
        wall["timing"] = round(_perf_counter() - t, 3)
        if req.timing_probe:
            self._probe(wall, before_kill=True)
        wall["round_trip_ms"] = self._round_trip_ms()
        ref_ms = req.ref_runtime_ms or (self.gate.ref_ms if self.gate is not None else None)
        ref_ms = self._credited_reference(new_ms, ref_ms, wall)
        if req.device.startswith("cuda"):  # the judge's share of the task's footprint (admission)
            import torch

            self.result.setdefault("task_profile", {})["judge_peak_bytes"] = int(torch.cuda.max_memory_reserved())
        speedup = ref_ms / new_ms if new_ms > 0 else float("inf")
        self.result.update(stage="done", timed=True, new_runtime_ms=new_ms, ref_runtime_ms=ref_ms,
                           new_runtime_spread=spread, speedup=speedup)
        self.result["flags"] = sorted(set(self.result["flags"]) | set(
            protocol.speedup_flags(speedup, float(req.excessive_speedup_threshold))))
        return self.result

    def _warm(self) -> None:
        """The gate's word, while this step waits for admission, that it is among the next to be
        admitted: CUDA starts in the judge and both runners now (trusted code: no answer is imported
        before admission), in the room the gate keeps for it, not inside the held window."""
        t, deadline = _perf_counter(), time.monotonic() + 120.0
        for r in (self.ref, self.cand):  # all three at once (a runner on the host has nothing to start)
            r._refuse_unasked()
            try:
                r.chan.send({"op": "warm"})
            except OSError as exc:  # gone before any answer code ran: the sandbox's failure
                raise Lost("sandbox_error", f"{r.role} runner gone before admission: {exc!r}", "load") from None
        if os.environ.get("CUDA_VISIBLE_DEVICES"):
            from sandbox import protocol

            protocol.start_cuda(self.req.device)
        for r in (self.ref, self.cand):
            try:
                r.reply("warm", deadline)
            except Lost as lost:  # before any answer code: never the answer's failure
                raise Lost("sandbox_error", f"{r.role} runner, starting CUDA: {lost.message}", "load") from None
        self.result["wall_s"]["warm"] = round(_perf_counter() - t, 3)

    def _footprint(self) -> dict[str, int] | None:
        """The task's footprint on the meta device (trusted task code, no answer imported yet): what
        the pool admits the step on until a step of the task has measured its peaks."""
        if not self.req.device.startswith("cuda"):
            return None
        from sandbox import footprint

        try:
            fp = footprint.measure(self.req.task_src, "task")
        except Exception:  # noqa: BLE001 - no estimate: the step is admitted alone
            return None
        return footprint.admission_fields(fp, self.req.timing_input_sets)

    def _loaded(self, r: Runner, kind: str | None) -> None:
        msg, _ = r.reply("load", self.deadline)
        if not msg["ok"]:
            k, stage, error = reported_failure(msg, "load")
            if kind is not None:  # the reference's own failure: the task's fault, never the answer's
                raise Lost(kind, f"reference: {error}", "load")
            raise Lost(k, error, stage)

    # --- calls --------------------------------------------------------------------------------

    def _call(self, r: Runner, k: int, poison: int, stage: str) -> tuple[Any, float, list[int]]:
        """One call of runner ``r`` on its set ``k``: (its output descriptors, not yet opened,
        seconds on the judge's clock, the descriptors' fds)."""
        seed = (self.sets[k] if k >= 0 else self.check_set)["seed"]
        # Before the clock starts: the runner drops its last outputs, poisons and seeds
        # the generator from the inputs' own seed (a random op in the task, dropout, then draws the
        # same values in both runners). The call that follows is the forward and its outputs alone.
        msg, fds = r.ask("prep", self.deadline, poison=poison, rng=seed)
        share._close_all(fds)
        if not msg["ok"]:
            kind, st, error = reported_failure(msg, stage)
            raise Lost("reference_error", f"reference: {error}", stage) if r is self.ref else Lost(kind, error, stage)
        self._poisoned(r, poison, "before", stage)
        t0 = _perf_counter()
        deadline, own, limit = self.deadline, None, 0.0
        if r is self.cand:
            if self.req.call_limit_s:  # sized from the task's known reference time
                # the answer's first call also sets itself up (Triton compiles its kernels, cuBLAS
                # and lazy modules load) on a host busy with other steps: three times the limit
                limit = float(self.req.call_limit_s) * (3.0 if self._first_call else 1.0)
                own = time.monotonic() + limit
                deadline = min(deadline, own)
            self._first_call = False
        try:
            # the reference's peak memory (admission) only from calls off the clock: asking for it
            # is work inside the call that the candidate's calls do not do (sandbox/call_path.py)
            peak = {"peak": True} if r is self.ref and stage != "timing" else {}
            msg, fds = r.ask("call", deadline, set=k, **peak)
        except Lost as lost:
            if lost.kind == "timeout" and own is not None and deadline == own:
                # the time the limit was sized from: the pool's (None with reference_per_step, which
                # still sizes the limit from it) or the judge's own first call of the reference
                ref = self.req.ref_runtime_ms or self._limit_ref_ms
                against = (f"{limit * 1000.0 / ref:.0f}x the reference's {ref:.3g} ms" if ref else
                           "far beyond the task's reference time")
                raise Lost("timeout", f"one call of the answer did not finish within {limit:.0f} s, {against}: "
                           "a kernel that does not end, or one far too slow to score", stage,
                           ("call_over_limit",)) from None
            if lost.kind == "timeout" and r is self.cand:
                raise Lost("timeout", f"a call of the answer did not finish within the step's run time limit "
                           f"({_perf_counter() - t0:.1f} s into the call): a kernel that does not end, or one "
                           "far too slow to score", stage) from None
            raise
        seconds = _perf_counter() - t0
        if not msg["ok"]:
            share.release(msg.get("outputs"), fds, self.req.device)
            kind, st, error = reported_failure(msg, stage)
            if r is self.ref:
                raise Lost("reference_error", f"reference forward: {error}", stage)
            flag = msg.get("flag")
            raise Lost(kind, error, st if st != "load" else stage,
                       (flag,) if kind == "rule_violation" and flag in RUNNER_FLAGS else ())
        self._poison = poison if r is self.cand else 0  # checked again once its outputs are open (_checked)
        if r is self.ref and isinstance(msg.get("peak_bytes"), int):
            self.result.setdefault("task_profile", {})["reference_peak_bytes"] = msg["peak_bytes"]
        return msg.get("outputs"), seconds, fds  # type: ignore[return-value]

    def _poisoned(self, r: Runner, poison: int, when: str, stage: str) -> None:
        """A correctness call of the candidate with its host poison off is a rule violation:
        checked here, in the runner's memory, not asked of the runner."""
        why = host_poison.disabled(r.pid, self.poison_at, when) if poison and r is self.cand else None
        if why:
            raise Lost("rule_violation", why, stage, ("host_poison_disabled",))

    def _open(self, r: Runner, descs: Any, fds: list[int], k: int, stage: str) -> share.Imported:
        """Map a runner's outputs after checking that none aliases an input or another output."""
        try:
            regions = share.regions_of(descs if isinstance(descs, list) else [], fds)
            if r is self.cand:
                for i, a in enumerate(regions):
                    for s in self.sets:
                        if any(share.overlaps(a, b) for b in s["regions"]):
                            raise Lost("rule_violation", f"output {i} shares memory with an input", stage,
                                       ("output_aliases_input",))
                    if any(share.overlaps(a, b) for b in regions[:i]):
                        raise Lost("rule_violation", f"output {i} shares memory with another output", stage,
                                   ("output_aliases_output",))
            return share.import_all(descs, fds, self.req.device)
        except Forged as exc:
            share._close_all(fds)
            if r is self.ref:
                raise Lost("sandbox_error", f"reference outputs unreadable: {exc}", stage) from None
            raise Lost("rule_violation", f"the candidate's outputs were forged: {exc}", stage,
                       ("forged_message",)) from None
        except Lost:
            share._close_all(fds)
            raise
        except Exception as exc:  # noqa: BLE001 - a handle that does not open, a wrong device
            from sandbox import protocol

            share._close_all(fds)
            raise Lost("runtime_error" if r is self.cand else "sandbox_error",
                       f"{r.role} outputs could not be opened: {protocol.describe_exception(exc, 300)}", stage) from None

    def _checked(self, k: int, stage: str, cand: tuple[Any, list[int]]) -> tuple[float, float]:
        """The candidate's outputs of the call just made on set ``k`` against the reference's on a
        fresh draw of the same seed; raises on any mismatch. Returns (max abs, max rel) error."""
        from sandbox import compare

        s = self.sets[k]
        # the parts are split finely (open, clone, release of the CUDA IPC handles) because a
        # trial's fixed cost, not its bytes, set the held window on the H200 (2026-12-05: ~0.2 s a
        # trial for outputs under 100 MB, as much as for 6 GB ones)
        t = _perf_counter()
        mine = self._open(self.cand, cand[0], cand[1], k, stage)
        self._spent("open", t)
        try:
            self._poisoned(self.cand, self._poison, "after", stage)  # its forward may have turned it off
        except Lost:
            mine.close()
            raise
        try:
            t = _perf_counter()
            new = [t.clone() if hasattr(t, "clone") else t for t in mine.tensors]  # frozen at once
            self._spent("clone", t)
        finally:
            t = _perf_counter()
            mine.close()
            self._spent("release", t)
        # nothing the answer left running (a process of its own) runs beside the reference
        sweep.kill_marked(os.environ.get(MARKER), keep=[self.ref.pid, self.cand.pid], everything=os.getpid() == 1)
        self._fill(self.check_set, s["seed"])
        t = _perf_counter()
        self._untouched(s, stage)
        self._spent("untouched", t)
        t = _perf_counter()
        descs, _, fds = self._call(self.ref, -1, 0, stage)
        self._spent("reference", t)
        t = _perf_counter()
        theirs = self._open(self.ref, descs, fds, -1, stage)
        self._spent("open", t)
        t = _perf_counter()
        try:
            import torch

            if not all(isinstance(x, torch.Tensor) for x in new):
                raise Lost("wrong_output", "candidate output is not a tensor", stage)
            bad, a, rel = compare.compare_with_errors(new, theirs.tensors, self.req.tolerance)
            if bad is None and stage == "correctness" and "strict_check" not in self.result:
                passing = checks.degenerate(theirs.tensors, self.check_set["values"], self.req.tolerance)
                self.result["strict_check"] = passing
                if passing:
                    self.result["flags"] = sorted(set(self.result["flags"]) | {"degenerate_check"})
            if bad is not None:
                if stage == "timing":
                    raise Lost("rule_violation", f"a timed call's output differs from the reference on the same "
                               f"inputs (a cached, constant or stale answer?): {bad.message}", stage, ("stale_output",))
                self.result.update(which_output=bad.which_output, max_abs_err=bad.max_abs_err,
                                   max_rel_err=bad.max_rel_err)
                raise Lost("wrong_output", f"trial {self.result.get('trials_passed', 0)}: {bad.message}", stage)
            if self.result.get("strict_check"):
                err = checks.relative_floor(new, theirs.tensors, self.req.tolerance, self.result["strict_check"])
                if err:
                    raise Lost("wrong_output" if stage == "correctness" else "rule_violation", err, stage,
                               () if stage == "correctness" else ("stale_output",))
            return a, rel
        finally:
            self._spent("compare", t)
            t = _perf_counter()
            theirs.close()
            self._spent("release", t)

    def _size_call_limit(self) -> None:
        """No reference time is known to the pool yet (a task's first evaluations; in an RL run,
        every evaluation of a task no answer has passed yet, since only a passing answer's step
        times the reference): one call of the reference, on the set the answer never sees and
        before the answer's first call, sizes the answer's call limit as a known time would.
        Without it a kernel that never ends ran to the step's limit (180 s), then once more alone
        (a timeout while sharing is re-run alone), and while it ran in a shared section no timed
        window on its GPU could open. The call includes the reference's own set-up, so the limit
        errs long."""
        req = self.req
        self._fill(self.check_set, int(req.seed))
        descs, seconds, fds = self._call(self.ref, -1, 0, "correctness")
        share.release(descs, fds, req.device)
        self._limit_ref_ms = seconds * 1000.0
        req.call_limit_s = call_limit(req, self._limit_ref_ms)

    def _correctness(self) -> None:
        req = self.req
        worst_abs = worst_rel = 0.0
        for i in range(int(req.correctness_trials)):
            k = i % len(self.sets)
            self._fill(self.sets[k], int(req.seed) + 1 + i)
            inputs_bytes = share.nbytes_of(self.sets[k]["values"])
            # candidate first: no reference output of these inputs exists anywhere yet
            poison = max(int(req.poison_bytes), min(2 * inputs_bytes, _MAX_POISON))
            descs, _, fds = self._call(self.cand, k, poison, "correctness")
            a, r = self._checked(k, "correctness", (descs, fds))
            worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
            self.result["trials_passed"] = i + 1
        self.result.update(correct=True, max_abs_err=worst_abs, max_rel_err=worst_rel)
