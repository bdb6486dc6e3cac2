"""Orchestration: resource pools, samplers and engines, episodes, trainer, weight push, the step loop.

Training and evaluation know nothing of kernels beyond :mod:`rewards.interface`; the supervised
warm start (sft, sft_data, warm_start, models.tiny) reads the answer corpus and prompts of
``rewards/`` directly.
"""
