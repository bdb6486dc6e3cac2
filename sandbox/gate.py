"""The judge's side of the device gate (the pool's side: sandbox/device_gate.py). A gated run step
prepares (task, runners, isolation) before it asks for its device, so the device is held only
while answer code can run on it: ``wait`` (admitted: its memory reserved, a shared section for load
and correctness), ``exclusive`` (the timing window: the device alone), ``done`` (its runners are
gone: the window goes back; its memory goes back when the pool has seen every process end).

The channel is a socket the pool passed to the outer process and that the judge alone keeps (the
runners close every other descriptor when they are forked): a socket, unlike a pipe, cannot be
reopened through /proc/<pid>/fd by a runner, so no answer can ask for, or give back, a window."""
from __future__ import annotations

import json
import os
import select
import time
from typing import Any, Callable


class Gate:
    def __init__(self, fd: int):
        self.fd, self.buf = fd, b""
        # the task's reference time as the pool knew it when the timing window was granted: the
        # first step of a task to reach its window times the reference and reports it with ``done``
        # (before the window goes back), so steps of the same task that were launched before any
        # time was known do not each time the reference again
        self.ref_ms: float | None = None

    def wait(self, footprint: dict[str, int] | None = None,
             warm: Callable[[], None] | None = None) -> tuple[float, Any]:
        """Admission and the shared section: (seconds spent waiting, the granted device index or None).
        ``footprint``: the task's meta-device bytes, which the pool admits on until it has measured.
        ``warm``: called when the pool says, before admission, that this step is among the next to
        be admitted (start CUDA now, so that the held window does not wait for it); the pool hears
        when it has returned."""
        t = time.monotonic()
        self._send({"ready": True, "footprint": footprint})
        while True:
            reply = self._read()
            if not reply.get("warm") or "device" in reply:
                return time.monotonic() - t, reply.get("device")
            if warm is not None:
                warm()
            self._send({"warmed": True})  # the pool admits a step it told to warm only after this

    def exclusive(self) -> float:
        """The device alone (the shared section given back first); seconds spent waiting."""
        t = time.monotonic()
        reply = self._ask({"exclusive": True})
        known = reply.get("ref_ms")
        self.ref_ms = float(known) if isinstance(known, (int, float)) and known > 0 else None
        return time.monotonic() - t

    def done(self, ref_ms: float | None = None) -> None:
        """The step's runners are gone: its window goes back (no reply), with the reference time it
        measured in that window, if it did."""
        self._send({"done": True, "ref_ms": ref_ms})

    def _send(self, msg: dict[str, Any]) -> None:
        if self.fd < 0:
            return
        try:
            os.write(self.fd, json.dumps(msg).encode() + b"\n")
        except OSError:
            pass

    def _ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        self._send(msg)
        return self._read()

    def _read(self) -> dict[str, Any]:
        """The pool's next message (a line), {} when the socket closed."""
        while self.fd >= 0 and b"\n" not in self.buf:
            select.select([self.fd], [], [])
            chunk = os.read(self.fd, 4096)
            if not chunk:
                break
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            reply = json.loads(line) if line else {}
        except ValueError:
            reply = {}
        return reply if isinstance(reply, dict) else {}

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
