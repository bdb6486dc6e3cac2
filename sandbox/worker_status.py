"""How a process ended, in words (for verdicts)."""
from __future__ import annotations

import os
import signal


def describe_status(status: int | None) -> str:
    if status is None:
        return "vanished"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return f"was killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"was killed by signal {sig}"
    return f"exited with code {os.WEXITSTATUS(status)}"
