"""Runs untrusted kernel code: isolated processes, compile cache, correctness and timing protocol.

Knows nothing of RL. Entry points: :class:`sandbox.pool.SandboxPool` (async, for the rollout side)
and ``python -m sandbox.eval`` (CLI, for people).
"""
