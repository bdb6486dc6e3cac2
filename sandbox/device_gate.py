"""The pool's side of one device's gate (a GPU, or the host with ``cpu_run_slots``): memory
admission, shared correctness sections, exclusive timing windows.

A run step's life on its device (docs/sandbox.md, "The device gate"):

1. ``admit``: it reserves its task's footprint (bytes of device memory, measured by the task's
   first step) before any of its processes allocates on the device; the reservations never add up
   past the budget, so no step pushes another out of memory. The first ``warm_slots`` steps in the
   admission queue are told to *warm* (start their CUDA contexts, no answer code yet) while they
   wait, so that their held window does not wait for CUDA; the pool keeps that room (three contexts
   a step) out of the budget, so contexts started before admission are counted too (on an 80 GB
   GPU, twelve waiting steps' uncounted contexts pushed newly starting ones out of memory). A
   step's place in the queue only moves forward, so no more than ``warm_slots`` are warm at once.
   A step that says when it is warm (``ready``, an event) is told even when the device is free
   and admitted only once it is: its CUDA never starts inside its held window (alone, a level-1
   evaluation held an H100 1.91 s with its three contexts started inside, 1.21 s without).
   A step whose footprint is not known yet and has no estimate, or a step re-run after a failure
   while sharing, is admitted *alone*: the whole budget, exclusive from the start, as the first
   protocol held a GPU. Admission is in arrival order, but a step that fits may go ahead of
   earlier ones that do not fit yet, as long as each of those has waited less than ``overtake_s``
   (so a large footprint at the head does not leave the device idle behind it, and is never
   starved: past that, the order is strict). With ``max_holders`` (``sandbox.gpu_max_steps``) no
   more than that many steps hold the device at once (until their ``done``), whatever their
   footprints: each shared section is stretched by every other one running beside it (a level-1
   evaluation held an H100 1.86 s alone, 3.4 s with twelve in flight, 2026-12-05), so a cap trades
   evaluations in flight for a shorter held window; the steps behind it wait warm.
2. ``shared``: load and correctness; any number of admitted steps at once, none while an exclusive
   window is held or asked for (timing is never starved).
3. ``exclusive``: timing. Its shared section is given back *before* it waits (two steps that each
   held a shared section while waiting for the other's would never move). While it is held, every
   other step that has loaded its answer and waits for its own window is frozen (``freeze``: the
   pool stops its processes), so no answer code queues GPU work beside a timed call.
4. ``done``: the step's judge has killed its runners; its window (shared or exclusive) goes back.
   ``release``: its processes are gone; its memory goes back.

Pure asyncio bookkeeping (no library offers an asyncio readers-writer lock with byte admission):
one condition, arrival order (with the bounded overtaking above) for admission, FIFO for
exclusive windows.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Callable

# what a grant is doing on its device
ADMITTED, SHARED, WAITING, EXCLUSIVE, FINISHED, RELEASED = (
    "admitted", "shared", "waiting", "exclusive", "finished", "released")


@dataclasses.dataclass(eq=False)
class Grant:
    need: int                      # reserved units (bytes on a GPU)
    alone: bool                    # admitted with the whole budget, exclusive from the start
    freeze: Callable[[bool], None] | None = None   # stop (True) / resume (False) the step's processes
    state: str = ADMITTED
    overlapped: bool = False       # another step held a reservation on the device at the same time
    warm: Callable[[], None] | None = None   # tell the step to start CUDA while it waits
    warmed: bool = False           # told to warm
    ready: asyncio.Event | None = None  # set once the step says its CUDA has started (None: not asked)
    frozen: bool = False
    queued_at: float = dataclasses.field(default_factory=time.monotonic)  # when it asked for admission


class DeviceGate:
    def __init__(self, token: Any, budget: int, overtake_s: float = 0.0, warm_slots: int = 0,
                 max_holders: int = 0):
        if budget < 1:
            raise ValueError(f"device gate budget {budget}: expected at least 1")
        self.token, self.budget, self.overtake_s = token, int(budget), float(overtake_s)
        self.max_holders = int(max_holders)  # steps holding the device at once (0: as many as fit)
        # waiting steps (the queue's first) told to start CUDA: their contexts' room is not in ``budget``
        self.warm_slots = int(warm_slots)
        self.reserved = 0
        self.holders: list[Grant] = []      # admitted and not yet released
        self._admit_queue: list[Grant] = []
        self._excl_queue: list[Grant] = []
        self._cond = asyncio.Condition()

    # --- queries (tests, stats) ----------------------------------------------------------------

    @property
    def exclusive_holder(self) -> Grant | None:
        return next((g for g in self.holders if g.state == EXCLUSIVE), None)

    @property
    def sharing(self) -> list[Grant]:
        return [g for g in self.holders if g.state == SHARED]

    # --- the step's life -----------------------------------------------------------------------

    async def admit(self, need: int | None, freeze: Callable[[bool], None] | None = None,
                    warm: Callable[[], None] | None = None, ready: asyncio.Event | None = None) -> Grant:
        """Reserve ``need`` units (None, or more than the budget: the whole device, alone). In
        arrival order, but for requests that fit going ahead of earlier ones that do not, each of
        which has waited less than ``overtake_s``. ``warm`` is called (at most once) if the step
        must wait while it is among the queue's first ``warm_slots``; with ``ready`` (set through
        :meth:`warm_done` when the step says its CUDA has started), also when it need not wait, and
        a step told to warm is then admitted only once it is warm."""
        alone = need is None or need >= self.budget
        grant = Grant(self.budget if alone else max(int(need), 0), alone, freeze, warm=warm, ready=ready)
        async with self._cond:
            self._admit_queue.append(grant)
            try:
                if ready is not None or not self._may_admit(grant):
                    self._warm_next()
                await self._cond.wait_for(lambda: self._may_admit(grant))
            except BaseException:
                self._admit_queue.remove(grant)
                self._warm_next()
                self._cond.notify_all()
                raise
            self._admit_queue.remove(grant)
            self._warm_next()
            self.reserved += grant.need
            if self.holders:
                grant.overlapped = True
                for g in self.holders:
                    g.overlapped = True
            self.holders.append(grant)
            if grant.alone:
                grant.state = EXCLUSIVE
            self._cond.notify_all()
        return grant

    def _fits(self, grant: Grant) -> bool:
        # a finished step (its answer gone, its processes ending) keeps its memory but not its place
        if self.max_holders and sum(h.state != FINISHED for h in self.holders) >= self.max_holders:
            return False
        return self.reserved + grant.need <= self.budget and (not grant.alone or not self.holders)

    def _may_admit(self, grant: Grant) -> bool:
        if not self._fits(grant) or (grant.warmed and grant.ready is not None and not grant.ready.is_set()):
            return False
        now = time.monotonic()
        for ahead in self._admit_queue:
            if ahead is grant:
                return True
            # an earlier request goes first if it fits, and may be passed only while it is young
            if self._fits(ahead) or now - ahead.queued_at >= self.overtake_s:
                return False
        return False

    def _warm_next(self) -> None:
        """Tell the queue's first ``warm_slots`` steps that have not been told yet to start CUDA."""
        for g in self._admit_queue[:self.warm_slots]:
            if not g.warmed and g.warm is not None:
                g.warmed = True
                g.warm()

    async def warm_done(self, ready: asyncio.Event) -> None:
        """The step whose ``admit`` was given ``ready`` says its CUDA has started."""
        async with self._cond:
            ready.set()
            self._cond.notify_all()

    async def shared(self, grant: Grant) -> None:
        """Enter the shared section (an alone grant already holds the device)."""
        if grant.alone:
            return
        async with self._cond:
            await self._cond.wait_for(lambda: self.exclusive_holder is None and not self._excl_queue)
            grant.state = SHARED

    async def exclusive(self, grant: Grant) -> None:
        """Give the shared section back, then wait for the device alone (others' answers frozen)."""
        if grant.state == EXCLUSIVE:
            return
        async with self._cond:
            grant.state = WAITING
            self._excl_queue.append(grant)
            self._cond.notify_all()
            try:
                await self._cond.wait_for(lambda: self._excl_queue[0] is grant and self.exclusive_holder is None
                                          and not self.sharing)
            except BaseException:
                self._excl_queue.remove(grant)
                self._cond.notify_all()
                raise
            self._excl_queue.pop(0)
            grant.state = EXCLUSIVE
            for g in self.holders:
                if g.state == WAITING and not g.frozen:
                    self._set_frozen(g, True)
            self._cond.notify_all()

    async def done(self, grant: Grant) -> None:
        """The step's answer is gone (its judge killed the runners): its window goes back."""
        async with self._cond:
            self._end_window(grant, FINISHED)

    async def release(self, grant: Grant) -> None:
        """The step's processes are gone: its memory goes back too (idempotent)."""
        async with self._cond:
            if grant.state == RELEASED:
                return
            if grant in self._excl_queue:
                self._excl_queue.remove(grant)
            self._end_window(grant, RELEASED)
            if grant.frozen:
                self._set_frozen(grant, False)
            self.holders.remove(grant)
            self.reserved -= grant.need

    def _end_window(self, grant: Grant, state: str) -> None:
        was_exclusive = grant.state == EXCLUSIVE
        grant.state = state
        if was_exclusive:
            for g in self.holders:
                if g.frozen:
                    self._set_frozen(g, False)
        self._cond.notify_all()

    @staticmethod
    def _set_frozen(grant: Grant, frozen: bool) -> None:
        grant.frozen = frozen
        if grant.freeze is not None:
            grant.freeze(frozen)


async def serve_gate(sock: Any, gate: DeviceGate, need: int | None, limit_s: float, clock: dict[str, Any],
                     freeze: Callable[[bool], None], estimate: Callable[[dict[str, Any]], int | None],
                     ref_time: tuple[Callable[[], float | None], Callable[[float], None]] | None = None) -> None:
    """The pool's end of one step's gate socket (sandbox/gate.py is the judge's): admission and the
    shared section on ``ready``, the exclusive window on ``exclusive``, the window back on ``done``.
    ``need``: bytes to reserve (None: alone), or -1: ``estimate`` of the footprint the judge sends
    with ``ready`` (its trusted meta-device measure; none: alone). ``ref_time``: (get, put) of the
    task's reference time: the exclusive grant tells the judge what is known by then, and a time the
    judge measured comes back with ``done``, stored before the window goes back.
    ``clock``: the step's ``deadline`` (no deadline while it waits; ``limit_s`` from admission; an
    exclusive wait added), and what it records: ``grant``, ``admitted``, ``device_shared``,
    ``exclusive_from``, ``device_exclusive``. Only the judge holds the other end. A step told to
    warm answers ``warmed`` once its CUDA has started, and is admitted only then."""
    import json
    import math
    import time

    reader, writer = await asyncio.open_unix_connection(sock=sock)
    pending: asyncio.Future | None = None   # the judge's next line, read while admission waits too
    admitting: asyncio.Future | None = None
    try:
        while True:
            pending = pending or asyncio.ensure_future(reader.readline())
            msg = _message(await pending)
            pending = None
            if msg is None:
                return
            grant = clock.get("grant")
            if msg.get("ready") and grant is None:
                clock["deadline"] = math.inf  # waiting for the device is not the step's time
                if need == -1:
                    fp = msg.get("footprint")
                    need = estimate(fp) if isinstance(fp, dict) else None
                ready = asyncio.Event()
                admitting = asyncio.ensure_future(
                    gate.admit(need, freeze, lambda: writer.write(b'{"warm": true}\n'), ready))
                while not admitting.done():
                    pending = pending or asyncio.ensure_future(reader.readline())
                    await asyncio.wait({admitting, pending}, return_when=asyncio.FIRST_COMPLETED)
                    if pending.done() and not admitting.done():
                        said = _message(pending.result())
                        pending = None
                        if said is None:
                            return   # the judge is gone: the admission is cancelled below
                        if said.get("warmed"):
                            await gate.warm_done(ready)
                grant = clock["grant"] = admitting.result()
                admitting = None
                await gate.shared(grant)
                clock["admitted"] = now = time.monotonic()
                clock["deadline"] = now + limit_s
                if grant.alone:
                    clock["exclusive_from"] = now
                writer.write(json.dumps({"device": gate.token[0]}).encode() + b"\n")
            elif msg.get("exclusive") and grant is not None:
                t, left = time.monotonic(), clock["deadline"] - time.monotonic()
                clock["deadline"] = math.inf
                if "exclusive_from" not in clock:
                    clock["device_shared"] = t - clock["admitted"]
                await gate.exclusive(grant)
                now = time.monotonic()
                clock.setdefault("exclusive_from", now)
                clock["deadline"] = now + left
                known = ref_time[0]() if ref_time is not None else None
                writer.write(json.dumps({"exclusive": True, "ref_ms": known}).encode() + b"\n")
            elif msg.get("done") and grant is not None:
                measured = msg.get("ref_ms")
                if ref_time is not None and isinstance(measured, (int, float)) and math.isfinite(measured) \
                        and measured > 0:
                    ref_time[1](float(measured))
                now = time.monotonic()
                if "exclusive_from" in clock:
                    clock["device_exclusive"] = now - clock["exclusive_from"]
                else:
                    clock["device_shared"] = now - clock["admitted"]
                await gate.done(grant)
            else:
                continue
            await writer.drain()
    finally:
        if pending is not None:
            pending.cancel()
        if admitting is not None:
            # cancelled while it waits (admit takes itself out of the queue), or admitted meanwhile:
            # then the grant is the step's, released with it by the caller
            admitting.cancel()
            await asyncio.gather(admitting, return_exceptions=True)
            if not admitting.cancelled() and admitting.exception() is None:
                clock["grant"] = admitting.result()
        writer.close()


def _message(line: bytes) -> dict[str, Any] | None:
    """One line of the judge's as a dict ({} when it is not one); None at the end of the socket."""
    if not line:
        return None
    import json

    try:
        msg = json.loads(line)
    except ValueError:
        return {}
    return msg if isinstance(msg, dict) else {}
