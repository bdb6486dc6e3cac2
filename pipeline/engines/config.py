"""Engine schema (values in conf/rollout/<engine>.yaml under ``engine:``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


@dataclass
class HFEngineConfig:
    max_batch_size: int = MISSING    # requests decoded together by one model.generate call
    batch_wait_s: float = MISSING    # how long the scheduler waits for callers to join a batch
    device: str = MISSING            # auto | cpu | cuda | cuda:N
    seed: Optional[int] = MISSING    # seeds the per-batch sampling seeds; null: fresh each run


@dataclass
class VLLMEngineConfig:
    gpu_memory_utilization: float = MISSING  # share of the GPU vLLM may take (weights + KV cache)
    max_model_len: int = MISSING             # prompt + response tokens of one sequence
    max_num_seqs: int = MISSING              # sequences vLLM schedules at once
    tensor_parallel_size: int = MISSING
    dtype: str = MISSING                     # auto | bfloat16 | float16 | float32
    enable_prefix_caching: bool = MISSING    # many samples share a prompt
    enforce_eager: bool = MISSING            # true: no CUDA graphs (faster start, slower decode)
    # largest batch (tokens) run as a CUDA graph; null: vLLM's min(2 x max_num_seqs, 512), raised to
    # max_num_seqs (on vLLM's capture stride) where larger: past it a decode step runs without graphs
    max_cudagraph_capture_size: Optional[int] = None
    enable_sleep_mode: bool = MISSING        # sleep() frees KV cache (and weights at level 2)
    sleep_level: int = MISSING               # 1: offload weights to CPU, drop KV; 2: drop both
    seed: int = MISSING
    # when the engine is idle and a request arrives, how long it keeps taking new requests before
    # its first step: a burst (a batch's trajectories) then starts as one batch, as LLM.generate's
    admit_wait_s: float = MISSING


@dataclass
class EngineConfig:
    type: str = MISSING              # hf | vllm
    max_inflight: int = MISSING      # requests admitted at once (semaphore): keeps the KV cache warm
    hf: HFEngineConfig = field(default_factory=HFEngineConfig)
    vllm: VLLMEngineConfig = field(default_factory=VLLMEngineConfig)


ENGINE_TYPES = ("hf", "vllm")
