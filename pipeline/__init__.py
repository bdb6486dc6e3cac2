"""Orchestration: pools, samplers and engines, episodes, trainer, weight sync, the step loop.

Knows nothing of kernels beyond :mod:`rewards.interface`.
"""
