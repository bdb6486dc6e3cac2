"""Generation with plain transformers (CPU, or a GPU without vLLM).

Many coroutines call :meth:`HFEngine.generate` at once. A scheduler task gathers what is pending
(for ``batch_wait_s``, up to ``max_batch_size`` requests with the same sampling settings), runs
one left-padded ``model.generate`` in a worker thread so the event loop stays free, and resolves
each caller with its tokens, log-probs and finish reason. Requests that arrive during a batch wait
for the next one (static batching: transformers' continuous-batching manager takes a single
generation config for all requests, which per-request sampling settings cannot use).

Log-probs: a logits processor placed before transformers' temperature/top-k/top-p warpers sees the
raw logits of each step, keeps ``log_softmax(raw / temperature)`` of the current step only and
gathers it at the token sampled from it, so memory stays one ``batch x vocab`` row per step.

Weights: ``load_weights`` copies into the live parameters under the same lock the batch holds, so
a batch always runs on one weights version, which its generations report.
"""
from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from pipeline.engines.base import Generation, SamplingParams, request_error


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future


class _SampledLogprobs:
    """LogitsProcessor: records log p(sampled token) per row without changing the scores."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature if temperature > 0 else 1.0
        self.steps: list[torch.Tensor] = []   # [B] per step
        self._last: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._collect(input_ids[:, -1])
        self._last = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _collect(self, tokens: torch.Tensor) -> None:
        if self._last is not None:
            self.steps.append(self._last.gather(1, tokens.view(-1, 1).to(self._last.device)).squeeze(1))
            self._last = None

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[B, steps] log-probs, given the tokens sampled at the last step."""
        self._collect(last_tokens)
        return torch.stack(self.steps, dim=1).cpu() if self.steps else torch.zeros(len(last_tokens), 0)


def _pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class HFEngine:
    """``Engine`` over an HF causal LM (``pipeline.engines.base`` documents the protocol)."""

    def __init__(self, model: Any, tokenizer: Any, max_inflight: int = 64, max_batch_size: int = 32,
                 batch_wait_s: float = 0.005, device: str = "auto",
                 seed: int | None = None) -> None:
        self.device = _pick_device(device)
        self._seeds = random.Random(seed)  # per-batch sampling seeds; the global torch RNG is left alone
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        # the chat end token (tokenizer) and the checkpoint's own EOS list both end a response
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos_ids = {t for t in (eos if isinstance(eos, (list, tuple)) else [eos]) if t is not None}
        if tokenizer.eos_token_id is not None:
            self.eos_ids.add(tokenizer.eos_token_id)
        if not self.eos_ids:
            raise ValueError("the tokenizer has no eos_token and the model's generation_config no "
                             "eos_token_id: responses could never stop")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.max_inflight, self.max_batch_size, self.batch_wait_s = max_inflight, max_batch_size, batch_wait_s
        self.version = 0
        self._lock = threading.Lock()          # one user of the parameters at a time
        self._pending: list[_Request] = []
        self._sem: asyncio.Semaphore | None = None
        self._has_work: asyncio.Event | None = None
        self._scheduler: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asleep = False
        self._stats = {"batches": 0, "requests": 0, "tokens": 0, "gen_s": 0.0, "errors": 0,
                       "weight_loads": 0}

    # ---- generation ----------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        error = request_error(self._asleep, prompt_ids, params)
        if error:
            return Generation.failed(error, self.version)
        vocab = self.model.get_input_embeddings().num_embeddings
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:  # an out-of-range embedding index would poison a CUDA context for every request
            return Generation.failed(f"prompt token id {bad[0]} outside the vocabulary (size {vocab})",
                                     self.version)
        self._start()
        assert self._sem is not None and self._has_work is not None
        async with self._sem:
            future = asyncio.get_running_loop().create_future()
            self._pending.append(_Request(list(prompt_ids), params, future))
            self._has_work.set()
            return await future

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # asyncio primitives belong to one loop (e.g. one per test)
            self._loop, self._pending = loop, []
            self._sem, self._has_work = asyncio.Semaphore(self.max_inflight), asyncio.Event()
            self._scheduler = None
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = loop.create_task(self._schedule())

    async def _schedule(self) -> None:
        while True:
            await self._has_work.wait()
            if len(self._pending) < self.max_batch_size:  # a full batch has no one left to wait for
                await asyncio.sleep(self.batch_wait_s)  # let callers of the same moment join
            self._pending = [r for r in self._pending if not r.future.done()]  # timed-out callers
            if not self._pending:
                self._has_work.clear()
                continue
            key = self._pending[0].params.batch_key()
            batch = [r for r in self._pending if r.params.batch_key() == key][: self.max_batch_size]
            taken = {id(r) for r in batch}
            self._pending = [r for r in self._pending if id(r) not in taken]
            if not self._pending:
                self._has_work.clear()
            results = await self._run_or_isolate(batch)
            for r, g in zip(batch, results):
                if not r.future.done():
                    r.future.set_result(g)

    async def _run_or_isolate(self, batch: list[_Request]) -> list[Generation]:
        """Run a batch; if it fails, run its requests one by one so one bad request fails alone."""
        try:
            return await asyncio.to_thread(self._run_batch, batch)
        except Exception as e:
            if len(batch) > 1:
                return [g for r in batch for g in await self._run_or_isolate([r])]
            self._stats["errors"] += 1
            return [Generation.failed(f"generation failed: {type(e).__name__}: {e}", self.version)]

    def _run_batch(self, batch: list[_Request]) -> list[Generation]:
        from transformers import LogitsProcessorList

        params = batch[0].params
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids):] = 1
        stop = self.eos_ids | set(params.stop_token_ids)
        recorder = _SampledLogprobs(params.temperature)
        greedy = params.temperature <= 0
        sampling = {} if greedy else dict(temperature=params.temperature, top_p=params.top_p,
                                          top_k=params.top_k if params.top_k > 0 else 0)
        seed = next((r.params.seed for r in batch if r.params.seed is not None), None)
        if seed is None:  # fork_rng restores the global state: draw a fresh seed per batch, or
            seed = self._seeds.getrandbits(63)  # every unseeded batch would repeat the same tokens
        t0 = time.perf_counter()
        with self._lock, torch.inference_mode(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                max_new_tokens=max(r.params.max_tokens for r in batch), do_sample=not greedy,
                eos_token_id=sorted(stop), pad_token_id=self.pad_id,
                logits_processor=LogitsProcessorList([recorder]), return_dict_in_generate=True,
                **sampling)
            version = self.version
        new = out.sequences[:, width:].cpu()
        logps = recorder.finish(out.sequences[:, -1]) if new.shape[1] else torch.zeros(len(batch), 0)
        results = []
        for i, r in enumerate(batch):
            toks, lps, reason = [], [], "length"
            for t in range(min(new.shape[1], r.params.max_tokens)):
                tok = int(new[i, t])
                toks.append(tok)
                lps.append(float(logps[i, t]))
                if tok in stop:
                    reason = "stop"
                    break
            results.append(Generation(toks, lps, reason, version=version, prompt_tokens=len(r.prompt_ids)))
        self._stats["batches"] += 1
        self._stats["requests"] += len(batch)
        self._stats["tokens"] += sum(len(g.token_ids) for g in results)
        self._stats["gen_s"] += time.perf_counter() - t0
        return results

    # ---- weights and memory ---------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        # remove_duplicate=False: tied weights (lm_head.weight = embed_tokens.weight, as in
        # Qwen2.5-0.5B) keep both names, since trainers export both.
        params = dict(self.model.named_parameters(remove_duplicate=False))
        params.update(dict(self.model.named_buffers(remove_duplicate=False)))
        with self._lock, torch.no_grad():
            for name, tensor in named_tensors:
                if name not in params:
                    raise KeyError(f"weight {name!r} is not a parameter of {type(self.model).__name__} "
                                   f"(expected HF checkpoint names, e.g. {next(iter(params))!r})")
                dst = params[name]
                if tuple(dst.shape) != tuple(tensor.shape):
                    raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)} does not match "
                                     f"the model's {tuple(dst.shape)}")
                dst.copy_(tensor.to(device=dst.device, dtype=dst.dtype))
            self.version = version
        self._stats["weight_loads"] += 1

    def check_weights(self, expected: dict[str, Any]) -> dict[str, Any]:
        """Compare the model's tensors with a sender's checksums (``pipeline.weight_push.base``)."""
        from pipeline.weight_push.base import compare_checksums

        with self._lock:
            return compare_checksums(expected, self.model.state_dict())

    def sleep(self) -> None:
        with self._lock:
            self._asleep = True
            if self.device.type == "cuda":
                self.model.to("cpu")
                torch.cuda.empty_cache()

    def wake(self) -> None:
        with self._lock:
            if self.device.type == "cuda":
                self.model.to(self.device)
            self._asleep = False

    def stats(self) -> dict[str, float]:
        s = dict(self._stats)
        s["tokens_per_s"] = s["tokens"] / s["gen_s"] if s["gen_s"] else 0.0
        s["mean_batch_size"] = s["requests"] / s["batches"] if s["batches"] else 0.0
        s["version"] = self.version
        return s

    async def aclose(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
            try:
                await self._scheduler
            except (asyncio.CancelledError, Exception):
                pass
            self._scheduler = None
        for r in self._pending:
            if not r.future.done():
                r.future.set_result(Generation.failed("engine closed", self.version))
        self._pending = []
