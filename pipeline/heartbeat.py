"""What each part of the step loop is doing, and a line about it when the log has been quiet.

With progress bars off (a log file, a batch job, a device call) a step prints one ``[step N]``
line when it ends; a first step of several minutes (cold kernel builds, a slow evaluation, a
first compile) would otherwise look exactly like a hang. The loop marks each part's work here
(``with activity.doing("trainer", "training batch 3"): ...``) and :meth:`Activity.beat` prints,
after ``every`` seconds without a line, what the sampler, the trainer and a push are doing and for
how long, with the sampler's batch in numbers (generated, scored, being evaluated) when its
workers answer. Written here because neither tqdm nor Ray's dashboard says it in a log file.
"""
from __future__ import annotations

import asyncio
import sys
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from rewards.interface import IN_FLIGHT_STAGES

if TYPE_CHECKING:
    from tqdm import tqdm

    from pipeline.parts import Samplers

PARTS = ("sampler", "trainer", "push")


def progress_bar(enabled: bool, total: int, desc: str, position: int = 0, initial: int = 0) -> tqdm:
    """tqdm on stderr (the loop's: samples of the batch being generated and scored; training
    steps); a disabled one draws nothing."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, leave=position > 0, file=sys.stderr, dynamic_ncols=True,
                position=position, initial=initial, disable=not enabled)


class Activity:
    def __init__(self) -> None:
        self.now: dict[str, tuple[str, float]] = {}   # part -> (what it is doing, since when)
        self.last_line = time.time()                  # the last [step] or heartbeat line

    @contextmanager
    def doing(self, part: str, what: str) -> Iterator[None]:
        self.now[part] = (what, time.time())
        try:
            yield
        finally:
            self.now.pop(part, None)

    def logged(self) -> None:
        """A [step] line went out: the heartbeat waits a whole period again."""
        self.last_line = time.time()

    async def beat(self, every: float, samplers: Samplers, expected: int) -> None:
        """Runs until cancelled: a :meth:`status` line after ``every`` seconds without one."""
        while True:
            await asyncio.sleep(min(every, 5.0))
            if time.time() - self.last_line < every:
                continue
            self.last_line = time.time()
            print(f"[pipeline] {await self.status(samplers, expected)}", file=sys.stderr, flush=True)

    async def status(self, samplers: Samplers, expected: int) -> str:
        """Each part's current work and for how long (a push only while one runs); the sampler's
        batch in numbers when its workers answer ``progress()`` within 5 s."""
        now = time.time()
        parts = {}
        for part in PARTS:
            if part in self.now:
                what, t0 = self.now[part]
                parts[part] = f"{part}: {what} for {now - t0:.0f} s"
            elif part != "push":
                parts[part] = f"{part}: idle"
        if "sampler" in self.now:
            try:
                live = await asyncio.wait_for(samplers.progress(), 5.0)
            except Exception as e:  # noqa: BLE001 - a line of progress never stops the run
                parts["sampler"] += f" (its workers did not answer: {type(e).__name__})"
            else:
                gen = sum(int(w.get("generated", 0)) for w in live)
                scored = sum(int(w.get("scored", 0)) for w in live)
                detail = f"{gen} of {expected} generated, {scored} scored, {gen - scored} being evaluated"
                detail += evaluator_detail(live)
                if any("engine_inflight" in w for w in live):
                    detail += f", {sum(int(w.get('engine_inflight', 0)) for w in live)} in the engine"
                parts["sampler"] += f" ({detail})"
        return "; ".join(parts.values())


STAGE_WORDS = {"queued": "queued", "build": "building", "run": "at the device (waiting for it or running)"}


def evaluator_detail(live: list[dict[str, float]]) -> str:
    """What the evaluations under way are doing, summed over the sampler workers (``eval/*`` of
    their progress): the reward tail of a step in the evaluator's terms. Empty where none report."""
    if not any(k.startswith("eval/") for w in live for k in w):
        return ""
    counts = [(STAGE_WORDS[stage], sum(int(w.get(f"eval/{stage}", 0)) for w in live)) for stage in IN_FLIGHT_STAGES]
    text = ": " + ", ".join(f"{n} {words}" for words, n in counts if n) if any(n for _, n in counts) else ""
    oldest = [w for w in live if "eval/oldest_s" in w]
    if oldest:
        w = max(oldest, key=lambda w: w["eval/oldest_s"])
        text += f"; the oldest {w['eval/oldest_s']:.0f} s, {STAGE_WORDS[IN_FLIGHT_STAGES[int(w['eval/oldest_stage'])]]}"
    return text
