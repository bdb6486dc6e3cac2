"""sandbox.device_gate.DeviceGate, the pool's shared/exclusive gate of one device, driven by many
simulated steps at once (the real class, no processes): its invariants hold at every change."""
from __future__ import annotations

import asyncio
import random

import pytest

from sandbox.device_gate import EXCLUSIVE, FINISHED, SHARED, WAITING, DeviceGate


class Watch:
    """Checks the gate's invariants after every change a step makes."""

    def __init__(self, gate: DeviceGate):
        self.gate, self.max_reserved, self.exclusive_windows, self.max_sharing = gate, 0, 0, 0

    def check(self) -> None:
        g = self.gate
        self.max_reserved = max(self.max_reserved, g.reserved)
        assert g.reserved <= g.budget, f"admission over the budget: {g.reserved} > {g.budget}"
        assert sum(h.need for h in g.holders) == g.reserved
        assert sum(w.warmed for w in g._admit_queue) <= g.warm_slots, "more waiting steps warm than room kept"
        holders = [h for h in g.holders if h.state == EXCLUSIVE]
        assert len(holders) <= 1, "two exclusive windows at once"
        self.max_sharing = max(self.max_sharing, len(g.sharing))
        if holders:
            assert not g.sharing, "a shared section ran inside an exclusive window (timing overlapped)"
            waiting = [h for h in g.holders if h.state == WAITING]
            assert all(h.frozen for h in waiting), "a loaded answer ran beside an exclusive window"
        else:
            assert not any(h.frozen for h in g.holders), "a step stayed frozen with no window held"


async def _step(gate: DeviceGate, watch: Watch, need: int | None, rng: random.Random, log: list) -> None:
    frozen_calls: list[bool] = []
    grant = await gate.admit(need, freeze=frozen_calls.append, warm=watch.check)  # told to warm: check then too
    watch.check()
    await gate.shared(grant)
    watch.check()
    await asyncio.sleep(rng.random() * 0.003)          # load and correctness
    watch.check()
    if rng.random() < 0.8:                              # a wrong answer never asks to be timed
        await gate.exclusive(grant)
        watch.check()
        assert grant.state == EXCLUSIVE
        watch.exclusive_windows += 1
        log.append(("start", id(grant)))
        await asyncio.sleep(rng.random() * 0.002)      # timing
        watch.check()
        log.append(("end", id(grant)))
    await gate.done(grant)
    watch.check()
    await asyncio.sleep(rng.random() * 0.001)          # its processes end
    await gate.release(grant)
    watch.check()
    assert frozen_calls == [x for pair in zip([True] * len(frozen_calls), [False] * len(frozen_calls))
                            for x in pair][:len(frozen_calls)], frozen_calls  # stop, resume, stop, ...


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_many_steps_share_within_the_budget_time_alone_and_all_finish(seed):
    rng = random.Random(seed)
    gate = DeviceGate(("gpu", "9.0"), budget=100, warm_slots=3)
    watch, log = Watch(gate), []
    # 60 steps at once, footprints from small to the whole device, some unknown (alone)
    needs = [rng.choice([5, 10, 30, 60, 100, 250, None]) for _ in range(60)]
    await asyncio.wait_for(asyncio.gather(*[_step(gate, watch, n, rng, log) for n in needs]), timeout=30)
    assert gate.reserved == 0 and not gate.holders
    assert watch.max_sharing >= 2, "no two steps ever shared the device"
    # exclusive windows never overlap one another
    open_ = 0
    for kind, _ in log:
        open_ += 1 if kind == "start" else -1
        assert open_ in (0, 1)


@pytest.mark.parametrize("cap", [1, 2, 3])
async def test_max_holders_caps_the_steps_on_the_device_whatever_fits(cap):
    rng = random.Random(cap)
    gate = DeviceGate(("gpu", "9.0"), budget=1000, warm_slots=3, max_holders=cap)
    watch, log, most = Watch(gate), [], [0]
    real_check = watch.check

    def check() -> None:
        real_check()
        most[0] = max(most[0], sum(h.state != FINISHED for h in gate.holders))
    watch.check = check  # type: ignore[method-assign]
    # 40 small steps: every one fits the memory budget, only the cap holds them back
    await asyncio.wait_for(asyncio.gather(*[_step(gate, watch, 10, rng, log) for _ in range(40)]), timeout=30)
    assert gate.reserved == 0 and not gate.holders
    assert most[0] == cap, f"{most[0]} unfinished steps held the device at once, cap {cap}"


async def test_a_capped_gate_admits_the_next_step_when_one_releases():
    gate = DeviceGate(("gpu", "9.0"), budget=1000, max_holders=2)
    a, b = await gate.admit(10), await gate.admit(10)
    third = asyncio.ensure_future(gate.admit(10))
    await asyncio.sleep(0.01)
    assert not third.done(), "a third step was admitted past max_holders=2"
    await gate.done(a)  # its answer is gone: its processes' teardown does not keep the next one out
    c = await asyncio.wait_for(third, 1)
    assert gate.reserved == 30, "the finished step's memory stays reserved until its processes are gone"
    fourth = asyncio.ensure_future(gate.admit(10))
    await asyncio.sleep(0.01)
    assert not fourth.done(), "a fourth step was admitted past max_holders=2"
    await gate.release(a)
    await asyncio.sleep(0.01)
    assert not fourth.done(), "the cap counts steps, not memory"
    await gate.release(b)
    d = await asyncio.wait_for(fourth, 1)
    for g in (c, d):
        await gate.release(g)


async def test_an_alone_step_waits_for_every_reservation_and_holds_the_device_from_the_start():
    gate = DeviceGate(("gpu", "9.0"), budget=100)
    small = await gate.admit(10)
    alone = asyncio.ensure_future(gate.admit(None))
    later = asyncio.ensure_future(gate.admit(10))   # FIFO: not before the alone step
    await asyncio.sleep(0.01)
    assert not alone.done() and not later.done()
    await gate.release(small)
    grant = await asyncio.wait_for(alone, 1)
    assert grant.state == EXCLUSIVE and gate.reserved == 100 and not later.done()
    assert not small.overlapped and not grant.overlapped
    await gate.release(grant)
    assert (await asyncio.wait_for(later, 1)).need == 10


async def test_a_step_waiting_for_its_timing_holds_no_shared_section():
    """Two steps both in their shared sections both ask for the device alone: each gives its shared
    section back before it waits, so neither waits for the other forever."""
    gate = DeviceGate(("gpu", "9.0"), budget=100)
    a, b = await gate.admit(10), await gate.admit(10)
    assert a.overlapped and b.overlapped
    await gate.shared(a)
    await gate.shared(b)
    wa = asyncio.ensure_future(gate.exclusive(a))
    wb = asyncio.ensure_future(gate.exclusive(b))
    await asyncio.wait_for(wa, 1)
    assert a.state == EXCLUSIVE and b.state == WAITING and b.frozen and not wb.done()
    # a new step cannot enter its shared section while a window is held or asked for
    c = await gate.admit(10)
    entering = asyncio.ensure_future(gate.shared(c))
    await asyncio.sleep(0.01)
    assert not entering.done()
    await gate.done(a)
    await asyncio.wait_for(wb, 1)
    assert b.state == EXCLUSIVE and not b.frozen
    await gate.done(b)
    await asyncio.wait_for(entering, 1)
    assert c.state == SHARED


async def test_a_cancelled_waiter_leaves_the_queues():
    gate = DeviceGate(("gpu", "9.0"), budget=10)
    a = await gate.admit(8)
    waiting = asyncio.ensure_future(gate.admit(8))
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    after = asyncio.ensure_future(gate.admit(2))
    assert (await asyncio.wait_for(after, 1)).need == 2
    await gate.release(a)


async def test_a_step_that_fits_passes_a_young_head_that_does_not_and_never_an_old_one():
    """Admission is in arrival order, but a footprint at the head that does not fit yet does not
    leave the device idle behind it: a later step that fits goes first while the head is younger
    than ``overtake_s``; past that the order is strict, so the head is never starved."""
    gate = DeviceGate(("gpu", "9.0"), budget=100, overtake_s=0.1)
    big = await gate.admit(70)
    head = asyncio.ensure_future(gate.admit(60))          # does not fit beside big
    await asyncio.sleep(0.01)
    small = await asyncio.wait_for(gate.admit(20), 1)     # fits: passes the young head
    assert not head.done() and gate.reserved == 90
    await gate.release(small)
    await asyncio.sleep(0.12)                             # the head is old now
    late = asyncio.ensure_future(gate.admit(20))
    await asyncio.sleep(0.05)
    assert not late.done() and not head.done(), "a step passed a head that waited past overtake_s"
    await gate.release(big)
    assert (await asyncio.wait_for(head, 1)).need == 60
    assert (await asyncio.wait_for(late, 1)).need == 20   # then the rest, in order
    strict = DeviceGate(("gpu", "9.0"), budget=100)       # overtake_s 0: strict arrival order
    big = await strict.admit(70)
    head = asyncio.ensure_future(strict.admit(60))
    await asyncio.sleep(0.01)
    small = asyncio.ensure_future(strict.admit(20))
    await asyncio.sleep(0.05)
    assert not small.done()
    await strict.release(big)
    await asyncio.wait_for(asyncio.gather(head, small), 1)


async def test_the_first_waiting_steps_are_told_to_warm_and_no_more_than_warm_slots():
    """Steps that must wait are told to start CUDA while they are among the admission queue's
    first ``warm_slots``; a step admitted at once is never told (its CUDA starts inside its
    reservation anyway), and a later step is told when the ones ahead of it leave the queue."""
    gate = DeviceGate(("gpu", "9.0"), budget=100, warm_slots=2)
    told: list[str] = []
    first = await gate.admit(100, warm=lambda: told.append("first"))      # fits: admitted, not told
    waiting = [asyncio.ensure_future(gate.admit(40, warm=lambda n=n: told.append(n))) for n in "abcd"]
    await asyncio.sleep(0.01)
    assert told == ["a", "b"]                                             # the queue's first two
    warm_in_queue = [g for g in gate._admit_queue if g.warmed]
    assert len(warm_in_queue) == 2
    await gate.release(first)                                             # a and b fit (80 of 100)
    await asyncio.sleep(0.01)
    assert waiting[0].done() and waiting[1].done() and told == ["a", "b", "c", "d"]
    for w in waiting[:2]:
        await gate.release(w.result())
    await asyncio.wait_for(asyncio.gather(*waiting[2:]), 5)
    assert told.count("c") == 1 and told.count("d") == 1


async def test_serve_gate_says_warm_before_the_grant():
    """The pool's end of the socket: a step that waits among the first warm_slots gets
    {"warm": true} first, then its device once admitted; Gate.wait (the judge's end) calls its
    warm hook for the first and returns on the second."""
    import socket
    import threading

    from sandbox.device_gate import serve_gate
    from sandbox.gate import Gate

    gate = DeviceGate(("gpu", "9.0"), budget=100, warm_slots=1)
    holder = await gate.admit(100)
    ours, theirs = socket.socketpair()
    clock = {"deadline": 0.0}
    served = asyncio.ensure_future(serve_gate(ours, gate, 40, 60.0, clock, lambda on: None, lambda fp: None))
    judge, calls, out = Gate(theirs.detach()), [], {}
    thread = threading.Thread(target=lambda: out.update(r=judge.wait(None, lambda: calls.append("warm"))))
    thread.start()
    for _ in range(200):
        if calls:
            break
        await asyncio.sleep(0.01)
    assert calls == ["warm"] and "grant" not in clock                     # warm before admission
    await gate.release(holder)
    await asyncio.to_thread(thread.join, 5)
    assert out["r"][1] == "gpu" and gate.reserved == 40
    judge.close()
    await asyncio.wait_for(served, 5)


def test_the_gate_budget_keeps_the_warm_steps_contexts_out():
    """An 80 GB card (79.2 GiB): 0.9 of it less three 1 GiB contexts for each of four warm steps."""
    from sandbox.config import load_default_config
    from sandbox.pool import gpu_gate_budget

    gib = 2**30
    cfg = load_default_config(gpu_memory_share=0.9, gpu_context_bytes=gib, gpu_warm_steps=4)
    budget, warm = gpu_gate_budget(int(79.18 * gib), cfg)
    assert warm == 4 and budget == int(int(79.18 * gib) * 0.9) - 12 * gib
    assert gpu_gate_budget(int(79.18 * gib), load_default_config(gpu_memory_share=0.0)) == (1, 0)
    assert gpu_gate_budget(0, cfg) == (1, 0)   # no size known: alone, nothing started early
    # 0.07 of a 139.8 GiB H200 (an engine and a trainer hold the rest): 9.8 GiB, room for one warm
    # step's three contexts within half of it
    small = load_default_config(gpu_memory_share=0.07, gpu_context_bytes=gib, gpu_warm_steps=4)
    budget, warm = gpu_gate_budget(int(139.8 * gib), small)
    assert warm == 1 and budget == int(int(139.8 * gib) * 0.07) - 3 * gib
    tiny = load_default_config(gpu_memory_share=0.03, gpu_context_bytes=gib, gpu_warm_steps=4)
    assert gpu_gate_budget(int(139.8 * gib), tiny) == (int(int(139.8 * gib) * 0.03), 0)


async def test_a_step_that_says_when_it_is_warm_is_told_at_once_and_admitted_only_then():
    """With ``ready`` the gate tells a step to warm even on a free device and admits it only once
    it is warm: its CUDA never starts inside its held window. Without, as before (never told when
    it fits at once)."""
    gate = DeviceGate(("gpu", "9.0"), budget=100, warm_slots=2)
    told: list[str] = []
    plain = await asyncio.wait_for(gate.admit(10, warm=lambda: told.append("plain")), 1)
    assert told == [], "a step that never says it is warm is not told when it fits at once"
    ready = asyncio.Event()
    first = asyncio.ensure_future(gate.admit(10, warm=lambda: told.append("first"), ready=ready))
    await asyncio.sleep(0.01)
    assert told == ["first"] and not first.done(), "a step told to warm was admitted before it was warm"
    await gate.warm_done(ready)
    grant = await asyncio.wait_for(first, 1)
    assert gate.reserved == 20
    for g in (grant, plain):
        await gate.release(g)


@pytest.mark.parametrize("seed", [3, 4])
async def test_steps_that_warm_first_share_within_the_budget_and_all_finish(seed):
    """Random steps that each take a while to warm: the invariants hold, every one is admitted
    only after it said it was warm (if told), and none waits forever behind a warming step."""
    rng = random.Random(seed)
    gate = DeviceGate(("gpu", "9.0"), budget=100, warm_slots=2, max_holders=3)
    watch = Watch(gate)

    async def step(need: int) -> None:
        ready, told = asyncio.Event(), []

        async def warm_later() -> None:
            await asyncio.sleep(rng.random() * 0.004)   # the judge and runners start CUDA
            await gate.warm_done(ready)

        def warm() -> None:
            told.append(True)
            asyncio.ensure_future(warm_later())
        grant = await gate.admit(need, freeze=lambda on: None, warm=warm, ready=ready)
        assert not told or ready.is_set(), "admitted before it was warm"
        watch.check()
        await gate.shared(grant)
        await asyncio.sleep(rng.random() * 0.003)
        await gate.exclusive(grant)
        watch.check()
        await gate.done(grant)
        await gate.release(grant)
        watch.check()

    needs = [rng.choice([5, 10, 30, 60]) for _ in range(40)]
    await asyncio.wait_for(asyncio.gather(*[step(n) for n in needs]), timeout=30)
    assert gate.reserved == 0 and not gate.holders


async def test_serve_gate_admits_a_step_on_a_free_device_after_it_is_warm():
    """The free device: the pool says warm first anyway, and the grant (and the held window's
    clock, ``admitted``) starts only once the judge's warm hook has returned."""
    import socket
    import threading
    import time

    from sandbox.device_gate import serve_gate
    from sandbox.gate import Gate

    gate = DeviceGate(("gpu", "9.0"), budget=100, warm_slots=1)
    ours, theirs = socket.socketpair()
    clock = {"deadline": 0.0}
    served = asyncio.ensure_future(serve_gate(ours, gate, 40, 60.0, clock, lambda on: None, lambda fp: None))
    judge, out, warmed_at = Gate(theirs.detach()), {}, []

    def warm() -> None:
        time.sleep(0.2)                    # CUDA starting in the judge and both runners
        warmed_at.append(time.monotonic())
    thread = threading.Thread(target=lambda: out.update(r=judge.wait(None, warm)))
    thread.start()
    await asyncio.to_thread(thread.join, 5)
    assert out["r"][1] == "gpu" and warmed_at, out
    assert clock["admitted"] >= warmed_at[0], "the held window started before the step was warm"
    judge.close()
    await asyncio.wait_for(served, 5)
    await gate.release(clock["grant"])
    assert gate.reserved == 0
