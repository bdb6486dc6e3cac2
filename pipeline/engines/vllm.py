"""A thin adapter over vLLM v1's in-process engine (checked against vLLM 0.24).

One thread owns the ``vllm.LLM`` and loops: take new requests / commands from a thread-safe
queue, ``llm_engine.step()`` while anything is unfinished, resolve finished requests on their
asyncio loop. That is vLLM's own continuous batching: a trajectory's next turn joins the running
batch at the next step, it does not wait for the batch to end.

* Prefix caching on (many trajectories share a prompt); a semaphore bounds in-flight requests.
  An idle engine takes requests for ``admit_wait_s`` before it steps, so a burst starts as one batch.
* Log-probs: ``logprobs_mode="processed_logprobs"`` with ``logprobs=1``: the sampled token's
  log-prob after temperature (and top-k/top-p, when set: then it is of the filtered distribution
  actually sampled from; with top_p=1, top_k=-1 it is ``log_softmax(logits / T)``, the trainer's).
* Weights: ``collective_rpc("reload_weights", weights_iterator=..., is_checkpoint_format=True)``
  (HF names, in place, keeps data pointers so CUDA graphs stay valid), a device synchronisation,
  then ``reset_prefix_cache()`` so no KV of the old weights is reused. It runs on the engine
  thread between two steps. A request reports the version it started under. ``check_weights``
  compares the model's tensors with the sender's checksums (``apply_model``), after a push.
* CUDA graphs up to ``max_num_seqs`` at least (``graph_capture_size``): vLLM's default stops at 512
  sequences, and past it every decode step runs without graphs, bound by kernel launches.
* ``sleep()``/``wake()``: vLLM sleep mode (level from config: 1 offloads weights and drops the KV
  cache). The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so weight
  tensors reach the worker without pickling.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import shutil
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from pipeline.engines.base import Generation, SamplingParams, request_error

if TYPE_CHECKING:
    from pipeline.engines.config import VLLMEngineConfig

log = logging.getLogger(__name__)


def graph_capture_size(cfg: VLLMEngineConfig) -> int | None:
    """The largest batch (in tokens) vLLM should capture as a CUDA graph:
    ``max_cudagraph_capture_size`` when set; else vLLM's own default, min(2 x max_num_seqs, 512)
    (mixed prefill and decode steps up to that many tokens run as graphs too), raised to
    ``max_num_seqs`` on vLLM's capture stride (8 below 256, 16 from there) where that is larger, so
    a full decode batch runs as a graph. None under ``enforce_eager``. vLLM's default alone leaves
    every decode step past 512 sequences without graphs (launch bound: a 0.5B model's steps at 672
    sequences took 60-70 ms on an H200)."""
    if cfg.enforce_eager:
        return None
    if cfg.max_cudagraph_capture_size is not None:
        return int(cfg.max_cudagraph_capture_size)
    n = int(cfg.max_num_seqs)
    stride = 16 if n >= 256 else 8
    return max(min(2 * n, 512), -(-n // stride) * stride)


def llm_kwargs(model_path: str, cfg: VLLMEngineConfig) -> dict[str, Any]:
    """``vllm.LLM``'s arguments from ``rollout.engine.vllm`` (a function of the config alone, so a
    CPU test can check them)."""
    kwargs: dict[str, Any] = dict(
        model=model_path, tokenizer=model_path, dtype=cfg.dtype,
        gpu_memory_utilization=cfg.gpu_memory_utilization, max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs, tensor_parallel_size=cfg.tensor_parallel_size,
        enable_prefix_caching=cfg.enable_prefix_caching, enforce_eager=cfg.enforce_eager,
        enable_sleep_mode=cfg.enable_sleep_mode, seed=cfg.seed,
        logprobs_mode="processed_logprobs", disable_log_stats=True)
    capture = graph_capture_size(cfg)
    if capture is not None:
        kwargs["compilation_config"] = {"max_cudagraph_capture_size": capture}
    return kwargs


def _graph_max_batch(llm: Any) -> int:
    """The largest captured batch vLLM settled on (it clamps to ``max_num_batched_tokens``); 0 when
    eager or when this vLLM does not say."""
    try:
        return int(llm.llm_engine.vllm_config.compilation_config.max_cudagraph_capture_size or 0)
    except AttributeError:
        return 0


def _vllm_env() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer may be absent


class VLLMEngine:
    def __init__(self, model_path: str, tokenizer: Any, cfg: VLLMEngineConfig, max_inflight: int = 256) -> None:
        _vllm_env()
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("rollout.engine.type=vllm needs vLLM (pip install -e '.[vllm]' on a "
                              f"GPU machine); use rollout=hf otherwise ({e})") from e
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.max_inflight = max_inflight
        self.eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        self.llm = LLM(**llm_kwargs(model_path, cfg))
        self.graph_max_batch = _graph_max_batch(self.llm)
        if self.graph_max_batch < cfg.max_num_seqs and not cfg.enforce_eager:
            log.warning("vLLM captures CUDA graphs up to %d sequences, max_num_seqs is %d: larger decode "
                        "batches step without graphs", self.graph_max_batch, cfg.max_num_seqs)
        self.admit_wait_s = float(cfg.admit_wait_s)
        self.version = 0
        self._asleep = False
        self._ids = itertools.count()
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: dict[str, tuple[asyncio.Future, asyncio.AbstractEventLoop, int, int]] = {}
        self._sems: dict[int, asyncio.Semaphore] = {}
        self._stats = {"requests": 0, "tokens": 0, "errors": 0, "weight_loads": 0, "steps": 0,
                       "busy_s": 0.0, "load_s": 0.0}
        self._closed = False
        self.owned_dir: str | None = None  # a temporary checkpoint written for this engine
        self._thread = threading.Thread(target=self._loop, name="vllm-engine", daemon=True)
        self._thread.start()

    # ---- the engine thread ----------------------------------------------------------------
    def _loop(self) -> None:
        engine = self.llm.llm_engine
        while not self._closed:
            busy = engine.has_unfinished_requests()
            try:
                item = self._inbox.get(block=not busy, timeout=None if not busy else 0)
            except queue.Empty:
                item = None
            # an idle engine that just got work waits up to admit_wait_s for the rest of the burst
            # (a batch's trajectories arrive within a millisecond or two): otherwise its first steps
            # run with the few requests that came first and the rest join one by one
            deadline = None if busy or item is None else time.perf_counter() + self.admit_wait_s
            while item is not None:
                self._handle(item)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    left = 0.0 if deadline is None else deadline - time.perf_counter()
                    try:
                        item = self._inbox.get(timeout=left) if left > 0 else None
                    except queue.Empty:
                        item = None
            if self._closed or not engine.has_unfinished_requests():
                continue
            t0 = time.perf_counter()
            try:
                outputs = engine.step()
            except Exception as e:  # the engine is broken: fail what waits, keep answering
                self._fail_all(f"vLLM step failed: {type(e).__name__}: {e}")
                continue
            self._stats["steps"] += 1
            self._stats["busy_s"] += time.perf_counter() - t0
            for out in outputs:
                if out.finished:
                    self._finish(out)

    def _handle(self, item: tuple) -> None:
        kind = item[0]
        if kind == "add":
            _, rid, prompt_ids, sp = item
            try:
                self.llm.llm_engine.add_request(rid, {"prompt_token_ids": prompt_ids}, sp)
            except Exception as e:  # e.g. prompt longer than max_model_len
                self._resolve(rid, Generation.failed(f"vLLM rejected the request: "
                                                     f"{type(e).__name__}: {e}", self.version))
        elif kind == "call":
            _, fn, done = item
            try:
                done["result"] = fn()
            except BaseException as e:
                done["error"] = e
            done["event"].set()
        elif kind == "stop":
            self._closed = True

    def _finish(self, out: Any) -> None:
        rid = out.request_id
        entry = self._waiting.get(rid)
        if entry is None:
            return
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        logprobs: list[float] = []
        for tok, top in zip(tokens, completion.logprobs or []):
            logprobs.append(float(top[tok].logprob))
        reason = completion.finish_reason
        if reason not in ("stop", "length"):
            gen = Generation(tokens, logprobs, "error", error=f"vLLM finished the request: {reason}",
                             version=entry[2], prompt_tokens=entry[3])
        elif len(logprobs) != len(tokens):
            gen = Generation(tokens, logprobs, "error", version=entry[2], prompt_tokens=entry[3],
                             error=f"vLLM returned {len(logprobs)} log-probs for {len(tokens)} tokens")
        else:
            gen = Generation(tokens, logprobs, reason, version=entry[2], prompt_tokens=entry[3])
        self._stats["tokens"] += len(tokens)
        self._resolve(rid, gen)

    def _resolve(self, rid: str, gen: Generation) -> None:
        entry = self._waiting.pop(rid, None)
        if entry is None:
            return
        future, loop = entry[0], entry[1]
        if gen.finish_reason == "error":
            self._stats["errors"] += 1
        loop.call_soon_threadsafe(lambda: future.done() or future.set_result(gen))

    def _fail_all(self, error: str) -> None:
        rids = list(self._waiting)
        try:
            self.llm.llm_engine.abort_request(rids)
        except Exception:
            pass  # the engine already failed; the callers get the error below
        for rid in rids:
            self._resolve(rid, Generation.failed(error, self.version))

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine thread between two steps; block until it is done."""
        if threading.current_thread() is self._thread:
            return fn()
        done: dict[str, Any] = {"event": threading.Event()}
        self._inbox.put(("call", fn, done))
        done["event"].wait()
        if "error" in done:
            raise done["error"]
        return done.get("result")

    # ---- the Engine protocol ----------------------------------------------------------------
    def _sampling_params(self, params: SamplingParams) -> Any:
        from vllm import SamplingParams as VSP
        from vllm.sampling_params import RequestOutputKind

        return VSP(temperature=params.temperature, top_p=params.top_p,
                   top_k=params.top_k if params.top_k > 0 else 0, max_tokens=params.max_tokens,
                   stop_token_ids=sorted(self.eos_ids | set(params.stop_token_ids)) or None,
                   seed=params.seed, logprobs=1, detokenize=False,
                   output_kind=RequestOutputKind.FINAL_ONLY)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        error = request_error(self._asleep, prompt_ids, params)
        if error:
            return Generation.failed(error, self.version)
        loop = asyncio.get_running_loop()
        sem = self._sems.setdefault(id(loop), asyncio.Semaphore(self.max_inflight))
        async with sem:
            future = loop.create_future()
            rid = f"r{next(self._ids)}"
            self._waiting[rid] = (future, loop, self.version, len(prompt_ids))
            self._stats["requests"] += 1
            self._inbox.put(("add", rid, list(prompt_ids), self._sampling_params(params)))
            try:
                return await future
            except asyncio.CancelledError:  # a timed-out caller: free its KV blocks
                self._call_soon(lambda: self.llm.llm_engine.abort_request([rid]))
                self._waiting.pop(rid, None)
                raise

    def _call_soon(self, fn: Callable[[], Any]) -> None:
        self._inbox.put(("call", fn, {"event": threading.Event()}))

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        # in-process (TP 1): the engine thread consumes the payload bucket by bucket, so a
        # broadcast or object-store transfer never holds a second full copy of the model here;
        # tensor-parallel workers live in other processes and get a picklable list
        weights = list(named_tensors) if self.cfg.tensor_parallel_size > 1 else iter(named_tensors)

        def reload() -> None:
            self.llm.collective_rpc("reload_weights", kwargs=dict(
                weights_iterator=weights, is_checkpoint_format=True))
            # the copies run on the device asynchronously: done before the sender may reuse its
            # buffers, and before the load is timed as done
            torch.cuda.synchronize()
            self.llm.reset_prefix_cache()  # cached prompt KV came from the old weights

        t0 = time.perf_counter()
        self._call(reload)
        self.version = version
        self._stats["weight_loads"] += 1
        self._stats["load_s"] = time.perf_counter() - t0

    def check_weights(self, expected: dict[str, Any]) -> dict[str, Any]:
        """Compare the model's tensors with a sender's checksums (HF names). vLLM stacks some HF
        tensors into one (``q_proj``, ``k_proj``, ``v_proj`` -> ``qkv_proj``: the model class's
        ``packed_modules_mapping``); their sums add up, so each is compared as its parts' total."""
        from pipeline.weight_push.base import compare_checksums

        if self.cfg.tensor_parallel_size > 1:  # each worker holds a shard: no whole tensor here
            return {"checked": 0, "problems": [], "unchecked": [
                f"tensor_parallel_size={self.cfg.tensor_parallel_size}: sharded engine not compared"]}

        def check(model: torch.nn.Module) -> dict[str, Any]:
            if callable(getattr(model, "unwrap", None)):  # a CUDA-graph wrapper around the model
                model = model.unwrap()
            packed = getattr(model, "packed_modules_mapping", None) or {}
            part_of = {part: fused for fused, parts in packed.items() for part in parts}
            tensors = dict(model.named_parameters())
            tensors.update(model.named_buffers())
            return compare_checksums(expected, tensors,
                                     lambda name: ".".join(part_of.get(c, c) for c in name.split(".")))

        return self._call(lambda: self.llm.apply_model(check)[0])

    def sleep(self) -> None:
        if not self.cfg.enable_sleep_mode:
            raise RuntimeError("rollout.engine.vllm.enable_sleep_mode=false: this engine cannot sleep")
        self._call(lambda: self.llm.sleep(level=self.cfg.sleep_level))
        self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self._call(self.llm.wake_up)
            self._asleep = False

    def stats(self) -> dict[str, float]:
        s = dict(self._stats)
        s["tokens_per_s"] = s["tokens"] / s["busy_s"] if s["busy_s"] else 0.0
        s["version"] = self.version
        s["inflight"] = len(self._waiting)
        s["graph_max_batch"] = self.graph_max_batch
        return s

    async def aclose(self) -> None:
        if not self._closed:
            self._inbox.put(("stop",))
            await asyncio.to_thread(self._thread.join, 60)
        for rid in list(self._waiting):
            self._resolve(rid, Generation.failed("engine closed", self.version))
        if self.owned_dir:
            shutil.rmtree(self.owned_dir, ignore_errors=True)
