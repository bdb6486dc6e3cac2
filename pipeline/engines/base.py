"""What every generation engine offers the episode driver.

``Engine.generate`` is a coroutine that many trajectories await at once; each engine batches
what is pending its own way. Log-probs are those of the *sampled* tokens under
``log_softmax(logits / temperature)`` over the full vocabulary (before top-k / top-p filtering),
which is exactly what the trainer recomputes; at temperature 0 (greedy) the raw logits are used.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, runtime_checkable

import torch

FINISH_REASONS = ("stop", "length", "error")


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1                          # -1: off
    max_tokens: int = 16
    stop_token_ids: list[int] = field(default_factory=list)  # besides the tokenizer's EOS
    seed: int | None = None

    def batch_key(self) -> tuple:
        """Requests with equal keys can share one batched decoding call."""
        return (self.temperature, self.top_p, self.top_k, tuple(sorted(self.stop_token_ids)))


@dataclass
class Generation:
    token_ids: list[int]                     # the stop token, when one ended it, is included
    logprobs: list[float]                    # one per token of token_ids
    finish_reason: str                       # "stop" | "length" | "error"
    error: str | None = None
    version: int = -1                        # weights version that produced it
    prompt_tokens: int = 0

    @classmethod
    def failed(cls, error: str, version: int = -1) -> "Generation":
        return cls(token_ids=[], logprobs=[], finish_reason="error", error=error, version=version)


def request_error(asleep: bool, prompt_ids: list[int], params: SamplingParams) -> str | None:
    """Why a request cannot be generated at all (every engine checks the same), or None."""
    if asleep:
        return "EngineAsleep: generate() between sleep() and wake()"
    if not prompt_ids:
        return "empty prompt"
    if params.max_tokens < 1:
        return f"max_tokens={params.max_tokens}: expected >= 1"
    return None


@runtime_checkable
class Engine(Protocol):
    version: int

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """Sample one response; never raises for a failed generation (finish_reason "error")."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy HF-named tensors into the live model in place (between batches); set ``version``.
        May be called several times for one version (one call per weight bucket)."""

    def check_weights(self, expected: dict[str, Any]) -> dict[str, Any]:
        """Compare the live tensors with a sender's per-tensor checksums (HF names) after a load:
        ``{"checked": n, "unchecked": [...], "problems": [...]}``
        (``pipeline.weight_push.base.compare_checksums``)."""

    def sleep(self) -> None:
        """Free what generation holds (KV cache; GPU weights for HF) until ``wake()``."""

    def wake(self) -> None:
        ...

    def stats(self) -> dict[str, float]:
        ...

    async def aclose(self) -> None:
        ...
