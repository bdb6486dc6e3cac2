"""Generation engines behind one protocol (``base.Engine``): transformers (``hf``) and vLLM."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

from pipeline.engines.base import Engine, Generation, SamplingParams
from pipeline.engines.config import ENGINE_TYPES, EngineConfig, HFEngineConfig, VLLMEngineConfig

__all__ = ["ENGINE_TYPES", "Engine", "EngineConfig", "Generation", "HFEngineConfig",
           "SamplingParams", "VLLMEngineConfig", "make_engine"]


def make_engine(cfg: EngineConfig, model: Any, tokenizer: Any) -> Engine:
    """An engine from ``rollout.engine``.

    ``model``: a loaded HF model (``hf``; for ``vllm`` it is saved to a temporary HF directory
    first, which is what the tiny model needs) or a checkpoint directory path (``vllm``; ``hf``
    loads it).
    """
    kind = cfg.type
    if kind not in ENGINE_TYPES:
        raise ValueError(f"rollout.engine.type={kind!r}: expected one of {ENGINE_TYPES}")
    if kind == "hf":
        from pipeline.engines.hf import HFEngine

        if isinstance(model, (str, os.PathLike)):
            from transformers import AutoModelForCausalLM

            from pipeline.hub import is_hub_id
            from pipeline.models.load import check_checkpoint_dir

            check_checkpoint_dir(str(model))
            model = AutoModelForCausalLM.from_pretrained(str(model), local_files_only=not is_hub_id(str(model)))
        h = cfg.hf
        return HFEngine(model, tokenizer, max_inflight=cfg.max_inflight,
                        max_batch_size=h.max_batch_size, batch_wait_s=h.batch_wait_s, device=h.device,
                        seed=h.seed)
    from pipeline.engines.vllm import VLLMEngine

    tmp_dir = None
    if not isinstance(model, (str, os.PathLike)):
        tmp_dir = tempfile.mkdtemp(prefix="vllm_model_")
        model.save_pretrained(tmp_dir)
        tokenizer.save_pretrained(tmp_dir)
        model = tmp_dir
    engine = VLLMEngine(str(model), tokenizer, cfg.vllm, max_inflight=cfg.max_inflight)
    engine.owned_dir = tmp_dir  # removed by aclose()
    return engine


def engine_counters(engine: Any) -> tuple[float, float]:
    """(steps, seconds inside them) so far: vLLM counts its engine steps, HF its generate calls."""
    return counters_of(engine.stats())


def counters_of(stats: Mapping[str, float]) -> tuple[float, float]:
    """``engine_counters`` from an engine's ``stats()`` dict (a sampler worker reports it remotely)."""
    if "steps" in stats:
        return float(stats["steps"]), float(stats.get("busy_s", 0.0))
    return float(stats.get("batches", 0.0)), float(stats.get("gen_s", 0.0))
