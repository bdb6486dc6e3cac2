"""Load the policy and its tokenizer from a ``ModelConfig``: a local HF directory or ``tiny``.

A local path is never downloaded to (``local_files_only=True``): a missing or malformed one fails
with a message that names it and says what a checkpoint directory must contain, and for a preset's
cache directory (``model=qwen2.5-coder-1.5b-instruct`` ...) the command that fetches it. A hub id
(``Qwen/Qwen2.5-Coder-1.5B-Instruct``: ``org/name``, no such local path) is accepted as it is and
loaded through the hub where one is reachable (transformers' own cache and ``HF_HUB_OFFLINE``).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from pipeline.conf_files import load_group
from pipeline.hub import is_hub_id

if TYPE_CHECKING:
    from pipeline.models.config import ModelConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def load_model_config(name: str = "tiny", overrides: list[str] | None = None) -> Any:
    """``conf/model/<name>.yaml`` merged onto the schema (for code outside the Hydra entry point)."""
    from pipeline.models.config import ModelConfig

    return load_group(ModelConfig, "model", name, overrides)


def check_checkpoint_dir(path: str) -> None:
    """Raise ``FileNotFoundError`` naming ``model.path`` unless it looks like an HF checkpoint (or
    is a hub id, which the hub checks when it loads)."""
    expected = ("a local Hugging Face checkpoint directory with config.json, the weights "
                f"({' or '.join(_WEIGHT_FILES[::2])}) and the tokenizer files; a hub id (org/name); "
                "or model.path=tiny")
    if is_hub_id(path):
        return
    from pipeline.models.fetch import fetch_hint, preset_of

    preset = preset_of(path)
    if preset is not None and not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"model.path={path!r}: the {preset} preset's checkpoint is not in the cache; "
                                f"fetch it first: {fetch_hint(preset)} (docs/evaluation.md)")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model.path={path!r} is not a directory: expected {expected}")
    missing = [] if os.path.isfile(os.path.join(path, "config.json")) else ["config.json"]
    if not any(os.path.isfile(os.path.join(path, f)) for f in _WEIGHT_FILES):
        missing.append("weights")
    if missing:
        raise FileNotFoundError(f"model.path={path!r} has no {' and no '.join(missing)}: "
                                f"expected {expected}")


def with_path(model_cfg: ModelConfig, path: str) -> ModelConfig:
    """A copy of the model config pointing at ``path`` (e.g. a checkpoint's HF directory)."""
    import copy
    import dataclasses

    if dataclasses.is_dataclass(model_cfg) and not isinstance(model_cfg, type):
        return dataclasses.replace(model_cfg, path=path)
    cfg = copy.deepcopy(model_cfg)
    cfg.path = path
    return cfg


def _torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise ValueError(f"model.dtype={name!r}: expected one of {DTYPES}")
    return "auto" if name == "auto" else getattr(torch, name)


def load_model_and_tokenizer(model_cfg: ModelConfig) -> tuple[Any, Any]:
    """(model in eval mode on CPU, tokenizer with a chat template and a pad token)."""
    dtype = _torch_dtype(model_cfg.dtype)
    if model_cfg.path == "tiny":
        from pipeline.models.tiny import build_tiny

        model, tokenizer = build_tiny(model_cfg.tiny)
        if dtype != "auto":
            model = model.to(dtype)
        return model, tokenizer

    from transformers import AutoModelForCausalLM

    path = os.path.expanduser(str(model_cfg.path))
    tokenizer = load_tokenizer(model_cfg)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=not is_hub_id(path), dtype=dtype,
                                                 trust_remote_code=bool(model_cfg.trust_remote_code))
    model.eval()
    return model, tokenizer


def _generic_fast_tokenizer(path: str) -> bool:
    """The directory's tokenizer says it is a plain ``tokenizers`` one (the tiny model's)."""
    import json

    cfg = os.path.join(path, "tokenizer_config.json")
    if not (os.path.isfile(cfg) and os.path.isfile(os.path.join(path, "tokenizer.json"))):
        return False
    with open(cfg) as f:
        return json.load(f).get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(model_cfg: ModelConfig) -> Any:
    """The tokenizer alone (a vLLM sampler loads the weights itself)."""
    if model_cfg.path == "tiny":
        from pipeline.models.tiny import build_tiny_tokenizer

        return build_tiny_tokenizer(model_cfg.tiny.vocab_size, model_cfg.tiny.tokenizer_corpus)
    from transformers import AutoTokenizer

    path = os.path.expanduser(str(model_cfg.path))
    check_checkpoint_dir(path)
    try:
        if _generic_fast_tokenizer(path):
            # transformers 5's AutoTokenizer maps a generic fast tokenizer in a qwen2 checkpoint to
            # Qwen2Tokenizer, which rebuilds the pre-tokenizer from Qwen's own pattern instead of
            # tokenizer.json's: the tiny model's saved tokenizer (a warm start, a run checkpoint)
            # would then split text differently from the one it was trained with
            from transformers import PreTrainedTokenizerFast

            tokenizer = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=not is_hub_id(path),
                                                      trust_remote_code=bool(model_cfg.trust_remote_code))
    except Exception as e:
        raise ValueError(f"model.path={path!r}: the tokenizer does not load ({type(e).__name__}: "
                         f"{e}); expected tokenizer.json or tokenizer_config.json there") from e
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"model.path={path!r}: the tokenizer has no chat template; episodes need "
                         "one (a chat/instruct checkpoint, or chat_template in tokenizer_config.json)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # batching needs a pad id; it is always masked
    return tokenizer
