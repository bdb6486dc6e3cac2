"""The timed windows of a run step (docs/sandbox.md, "One run step"): calls of one runner on fresh
inputs, the cache flushed, some checked at random; the reference time a speedup is taken against;
the bench-only probe windows. A mixin of sandbox.run_step.RunStep, whose ``req``, ``ref``,
``cand``, ``sets``, ``seeds``, ``rng``, ``deadline``, ``gate`` and ``result`` it reads, and whose
``_call``, ``_checked`` and ``_fill`` it calls."""
from __future__ import annotations

import os
import time
from typing import Any

from sandbox import share, sweep
from sandbox.judge import Runner
from sandbox.wire import MARKER

_perf_counter = time.perf_counter  # captured before any answer exists anywhere near this process
_WARM_S = 0.05          # seconds of the judge's own GPU work before each timing loop
_PROBE_SETTLE_S = 0.5   # timing_probe: how long the reference waits before its settled window
_MIN_SLOW_RUNS = 3      # timed calls of an answer cut by timing_budget_s
TIMING_CUT = "timing_cut"  # the flag of a result whose answer made fewer timed calls (timing_budget_s)


class Timing:
    """The timing half of a run step."""

    def _credited_reference(self, new_ms: float, ref_ms: float | None, wall: dict[str, Any]) -> float:
        """The reference time the answer's speedup is taken against (``ref_ms``: the known one, if
        any). A known reference time never credits a win: an answer that looks faster than it is
        paired with the reference timed here, right after it, under the same load. A reference timed
        once while the machine was busy is slow, and every answer scored against it looks fast. Nor
        does the paired time alone: load only ever slows a call, and a window right after a quiet
        one can be the busy one (a laptop run credited a SiLU 2.87x and 5.75x against a reference
        paired at 3.7x its known time, while generation shared the two cores), so the win is the
        fastest of the reference times over the answer's (with no known time, as with
        reference_per_step, a second window after the first and one before the answer's stand in
        for it: ``ref_before_ms``)."""
        known = ref_ms
        if ref_ms is None or new_ms <= 0 or ref_ms / new_ms > 1.0:
            self.cand.kill()  # nothing of the answer runs while the reference is timed
            sweep.kill_marked(os.environ.get(MARKER), keep=[self.ref.pid], everything=os.getpid() == 1)
            if ref_ms is not None:
                wall["ref_known_ms"] = round(ref_ms, 6)
            t = _perf_counter()
            ref_ms, self.result["ref_runtime_spread"] = self._time(self.ref, check=False)
            self.measured_ref_ms = ref_ms
            wall["ref_timing"] = round(_perf_counter() - t, 3)
            if new_ms > 0 and ref_ms / new_ms > 1.0:
                # a win must survive a second window of the reference (the answer is gone: nothing
                # of it can slow this one); the faster window counts
                again = self._time(self.ref, check=False)[0]
                wall["ref_again_ms"] = round(again, 6)
                ref_ms = min(ref_ms, again)
                self.measured_ref_ms = ref_ms
            before = wall.get("ref_before_ms")
            if before and before < ref_ms:  # timed with the answer loaded: load only slows a window
                ref_ms = before
                self.measured_ref_ms = ref_ms
            if known is not None and known < ref_ms:
                wall["ref_paired_ms"] = round(ref_ms, 6)
                ref_ms = known
            if self.req.timing_probe:
                self._probe(wall, before_kill=False)
        return ref_ms

    def _round_trip_ms(self, n: int = 7) -> float:
        """Median milliseconds of a bare call to the reference runner (no forward, no outputs): the
        part of every timed call that is the protocol's, in both times alike (reported, not
        subtracted: a kernel faster than this has its speedup pulled toward 1)."""
        import statistics

        times = []
        for _ in range(n):
            t0 = _perf_counter()
            self.ref.ask("ping", self.deadline)
            times.append((_perf_counter() - t0) * 1000.0)
        return round(statistics.median(times), 4)

    def _probe(self, wall: dict[str, Any], before_kill: bool) -> None:
        """``timing_probe`` (benches only): more timed windows, to tell the order of the windows from
        the candidate's kill. Before the kill: the reference while the candidate still lives (so an
        answer's leftovers could slow it: never used for a speedup), then the candidate again.
        After the reference's own window: the reference again at once, and once more after a
        settle of ``_PROBE_SETTLE_S``."""
        if before_kill:
            wall["probe_ref_alive_ms"] = round(self._time(self.ref, check=False)[0], 6)
            wall["probe_cand_again_ms"] = round(self._time(self.cand, check=False)[0], 6)
            return
        wall["probe_ref_again_ms"] = round(self._time(self.ref, check=False)[0], 6)
        time.sleep(_PROBE_SETTLE_S)
        wall["probe_ref_settled_ms"] = round(self._time(self.ref, check=False)[0], 6)

    def _time(self, r: Runner, check: bool) -> tuple[float, float]:
        """Median milliseconds of ``runs`` calls timed here (after ``warmup`` calls), each on values
        never seen before, the cache flushed; with ``check``, some calls chosen at random are checked.
        Returns (median, relative spread: interquartile range over the median)."""
        import statistics

        import torch

        from sandbox import protocol

        req = self.req
        warmup, runs, n = int(req.warmup_runs), int(req.timing_runs), len(self.sets)
        budget = float(req.timing_budget_s) if r is self.cand else 0.0
        checked = set()
        if check:
            for k in range(n):  # at least one per input set, then about checked_share of the rest
                own = [i for i in range(runs) if i % n == k]
                if own:
                    checked.add(self.rng.choice(own))
            checked |= {i for i in range(runs) if self.rng.random() < float(req.checked_share)}
        flush = torch.empty(max(int(req.flush_bytes), 1), dtype=torch.uint8, device=req.device) \
            if int(req.flush_bytes) > 0 else None
        if flush is not None and req.device.startswith("cuda"):
            # an idle GPU's clocks ramp up over tens of ms: the first step of a pool timed its
            # candidate 1.8-2.6x slow against the reference timed after it (H200, 2026-12-04)
            t_warm = _perf_counter()
            while _perf_counter() - t_warm < _WARM_S:
                flush.zero_()
                protocol.synchronize(req.device)
        times = []
        j = 0
        while j < warmup + runs:
            i = j - warmup
            k = j % n
            self._fill(self.sets[k], next(self.seeds))
            if flush is not None:
                flush.zero_()
            protocol.synchronize(req.device)
            descs, seconds, fds = self._call(r, k, 0, "timing")
            if i >= 0:
                times.append(seconds * 1000.0)
            if i in checked:
                self._checked(k, "timing", (descs, fds))
            else:
                share.release(descs, fds, req.device)
            if j == 0 and budget > 0 and seconds * (warmup + runs) > budget:
                # an answer this slow holds the device alone (every other step's timing waits) for
                # warmup + runs of its calls, to measure a speedup far below 1 to a precision no
                # reward needs: it makes the calls that fit the budget, at least _MIN_SLOW_RUNS timed,
                # each of them checked (fewer calls must not mean fewer chances to catch a wrong one)
                warmup = min(warmup, 1)  # the call just made was it (with no warm-up, it was timed)
                runs = max(_MIN_SLOW_RUNS, min(runs, int(budget / max(seconds, 1e-9)) - 1))
                checked = set(range(runs)) if check else set()
                self.result["flags"] = sorted({*self.result["flags"], TIMING_CUT})
            j += 1
        median = float(statistics.median(times))
        q = statistics.quantiles(times, n=4) if len(times) >= 2 else [median, median, median]
        return median, (q[2] - q[0]) / median if median > 0 else 0.0
