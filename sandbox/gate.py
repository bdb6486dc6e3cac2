"""The judge's side of the device gate: a gated run step prepares (task, runners, isolation)
before the pool gives it the device, then waits for the pool's word, so its device is held only
while answer code can run on it. The pipes are the pool's (the worker's stdin and stdout), kept by
the judge alone and closed before any answer code is imported anywhere."""
from __future__ import annotations

import json
import os
import select
import time
from typing import Any


class Gate:
    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd, self.buf = rfd, wfd, b""

    def wait(self) -> tuple[float, Any]:
        """(seconds spent waiting, the granted device index or None)."""
        t = time.monotonic()
        os.write(self.wfd, b'{"ready": true}\n')
        while b"\n" not in self.buf:
            select.select([self.rfd], [], [])
            chunk = os.read(self.rfd, 4096)
            if not chunk:
                break
            self.buf += chunk
        line = self.buf.split(b"\n", 1)[0]
        grant = json.loads(line) if line else {}
        self.close()
        return time.monotonic() - t, grant.get("device") if isinstance(grant, dict) else None

    def close(self) -> None:
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass
