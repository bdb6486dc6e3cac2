"""LoRA for the trainer (``trainer.lora``): peft's adapters on the policy, and the weights that
leave the trainer as what the samplers and checkpoint readers load: merged, under base names.

Why this module exists: peft (``get_peft_model``) makes the adapters and freezes the base, but
what no library does for this trainer is the way out. The samplers (vLLM, the HF engine) load
plain HF checkpoints, so every push must carry ``W + scale * B @ A`` under the base model's names
(``...q_proj.weight``, never ``...q_proj.base_layer.weight`` or ``...lora_A.default.weight``),
computed without touching the trained model (peft's ``merge_adapter`` merges in place, which
under FSDP2 would write into sharded parameters that the optimiser is still stepping). Here each
LoRA-wrapped weight is merged on the fly from the state dict the transport already has (a
gathered copy, or the rank's own DTensors), one tensor at a time.

Checkpoints keep ``model/`` the merged policy (what evaluation and any HF reader expect) and add
``adapter/`` in peft's own format (``PeftModel.from_pretrained(base, adapter/)`` loads it). A
resume rebuilds the frozen base from ``model.path``, as the run started, and loads the adapter:
the run goes on with exactly the weights it saved, not with a merge rounded back into a base.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

if TYPE_CHECKING:
    from pipeline.models.config import ModelConfig
    from pipeline.trainer.config import LoraConfig, TrainerConfig

ADAPTER = "default"  # peft's name for the one adapter get_peft_model makes
ADAPTER_DIR = "adapter"
_PEFT_PREFIX = "base_model.model."  # PeftModel's own names put this before the HF model's
_OUTPUT_LAYER = ("trainer.lora.target_modules wraps the output layer: the chunked log-prob head "
                 "(trainer.logprob_chunk_tokens) reads its weight directly, so its adapter would "
                 "never train; leave it out (all-linear does)")


def enabled(trainer_cfg: TrainerConfig) -> bool:
    return trainer_cfg.lora.rank > 0


def peft_config(lora: LoraConfig) -> Any:
    from peft import LoraConfig

    targets = lora.target_modules
    targets = targets if isinstance(targets, str) else list(targets)
    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM")


def apply(model: torch.nn.Module, lora: LoraConfig, resume_dir: str | None = None) -> torch.nn.Module:
    """``model`` with peft's LoRA layers injected and only the adapters trainable; the adapter
    weights of ``resume_dir``'s checkpoint loaded when given. Returns the HF model itself (not
    the PeftModel wrapper): FSDP2 wraps its decoder layers, and the log-prob head replaces its
    forward, exactly as without LoRA; names only gain ``.base_layer`` and ``.lora_A/B.default``."""
    from peft import get_peft_model

    inner = get_peft_model(model, peft_config(lora)).get_base_model()
    bad = [n for n, m in inner.named_modules() if _is_lora_layer(m) and not isinstance(m, _peft_linear())]
    if bad:  # an embedding's lora_embedding_A/B would need another merge rule
        raise ValueError(f"trainer.lora.target_modules wraps non-linear modules {bad[:3]}: LoRA here "
                         "merges linear layers only")
    if _is_lora_layer(inner.get_output_embeddings()):
        raise ValueError(_OUTPUT_LAYER)
    if resume_dir:
        load_adapter(inner, os.path.join(resume_dir, ADAPTER_DIR))
    return inner


def _peft_linear() -> type:
    from peft.tuners.lora import Linear

    return Linear


def _is_lora_layer(module: torch.nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer)


def scales(model: torch.nn.Module) -> dict[str, tuple[float, bool]]:
    """Per LoRA-wrapped module (its name in the state dict): peft's scale (``alpha / rank``) and
    whether the base weight is stored transposed (``fan_in_fan_out``, GPT-2's Conv1D)."""
    if "peft" not in sys.modules:  # no LoRA layer can exist: a run without LoRA never imports peft
        return {}
    return {name: (float(m.scaling[ADAPTER]), bool(m.fan_in_fan_out))
            for name, m in model.named_modules() if _is_lora_layer(m)}


def is_adapter(name: str) -> bool:
    return ".lora_" in name


def base_name(name: str) -> str:
    """A peft state-dict name as the base model's: ``base_model.model.`` and ``.base_layer`` go."""
    return name.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".")


def export_shapes(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``sd``'s exported entries under base names, unmerged: their shapes, dtypes and order are
    those of the merged ones (for buffer layouts sized before any merge)."""
    return {base_name(k): t for k, t in sd.items() if not is_adapter(k)}


def merged(sd: dict[str, torch.Tensor], lora_scales: dict[str, tuple[float, bool]],
           whole: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> Iterator[tuple[str, torch.Tensor]]:
    """``(base name, tensor)`` in ``sd``'s order, adapters left out, each LoRA-wrapped weight as
    ``W + scale * B @ A`` in a new tensor (the model's own parameters are never written).

    ``whole`` turns an entry into the full tensor (``full_tensor`` for a sharded state dict: a
    collective, called in the same order on every rank). ``sd`` is consumed: each entry is
    dropped once yielded, so a gathered copy's memory goes as the merged one comes (one extra
    tensor at a time, not a second model)."""
    for name in list(sd):
        if is_adapter(name):
            continue
        t = sd.pop(name)
        module, _, leaf = name.rpartition(".")
        owner = module.removesuffix(".base_layer")
        if leaf != "weight" or owner == module or owner not in lora_scales:
            yield base_name(name), whole(t)
            continue
        scale, transposed = lora_scales[owner]
        w = whole(t)
        a = whole(sd[f"{owner}.lora_A.{ADAPTER}.weight"]).to(w.device)
        b = whole(sd[f"{owner}.lora_B.{ADAPTER}.weight"]).to(w.device)
        delta = (b.float() @ a.float()) * scale  # fp32 whatever the master dtype: rank-r sums
        yield base_name(name), (w.float() + (delta.T if transposed else delta)).to(w.dtype)


# ---- checkpoints --------------------------------------------------------------------------
def _peft_key(name: str) -> str:
    """Our adapter name as peft's saved one: PeftModel's prefix, no adapter name."""
    return _PEFT_PREFIX + name.replace(f".{ADAPTER}.", ".")


def save_adapter(sd: dict[str, torch.Tensor], lora: LoraConfig, directory: str) -> None:
    """The adapter of a full state dict as peft writes it (adapter_model.safetensors,
    adapter_config.json), loadable with ``PeftModel.from_pretrained(base, directory)``."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    adapter = {_peft_key(k): t.detach().contiguous() for k, t in sd.items() if is_adapter(k)}
    save_file(adapter, os.path.join(directory, "adapter_model.safetensors"))
    peft_config(lora).save_pretrained(directory)


def load_adapter(model: torch.nn.Module, directory: str) -> None:
    """A saved adapter into ``model``'s LoRA layers; every adapter weight must be there."""
    from safetensors.torch import load_file

    saved = load_file(os.path.join(directory, "adapter_model.safetensors"))
    own = {_peft_key(k): (k, t) for k, t in model.state_dict().items() if is_adapter(k)}
    missing = sorted(set(own) - set(saved))
    unknown = sorted(set(saved) - set(own))
    resized = sorted(k for k in set(own) & set(saved) if own[k][1].shape != saved[k].shape)
    if missing or unknown or resized:
        raise ValueError(f"adapter {directory} does not fit trainer.lora (rank, target_modules): "
                         f"missing {missing[:3]}, unknown {unknown[:3]}, other shape {resized[:3]}")
    model.load_state_dict({own[k][0]: t for k, t in saved.items()}, strict=False)


# ---- configuration checks (pipeline/config.py, before Ray starts) -------------------------
def check(lora: LoraConfig, model_cfg: ModelConfig) -> list[str]:
    """What is wrong with ``trainer.lora`` for this model, one line each (nothing when off)."""
    errors = []
    if lora.rank < 0:
        errors.append(f"trainer.lora.rank={lora.rank}: expected >= 0 (0: LoRA off, full fine-tuning)")
    if lora.rank == 0:
        return errors
    if lora.alpha <= 0:
        errors.append(f"trainer.lora.alpha={lora.alpha}: expected > 0 (the adapter's scale is alpha / rank)")
    if not 0 <= lora.dropout < 1:
        errors.append(f"trainer.lora.dropout={lora.dropout}: expected in [0, 1)")
    targets = lora.target_modules
    if lora.rank < 0 or (isinstance(targets, str) and targets == "all-linear"):
        return errors
    try:
        modules, output = _module_types(model_cfg)
    except Exception:  # a model that cannot be read is reported by model.path's own check
        return errors
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    for target in ([targets] if isinstance(targets, str) else list(targets)):
        one = LoraConfig(target_modules=target if isinstance(targets, str) else [target])
        hits = {name: kind for name, kind in modules.items() if check_target_module_exists(one, name)}
        if output in hits:
            errors.append(f"{_OUTPUT_LAYER} ({target!r} matches {output!r})")
        elif not any(issubclass(k, torch.nn.Linear) for k in hits.values()):
            kinds = sorted({k.__name__ for k in hits.values()})
            what = f"no linear layer (only {kinds})" if hits else "no module"
            linear = sorted({n.rpartition('.')[2] for n, k in modules.items()
                             if issubclass(k, torch.nn.Linear) and n != output})
            errors.append(f"trainer.lora.target_modules: {target!r} matches {what} in the model; its "
                          f"linear layers are named {linear} (or all-linear)")
    return errors


def _module_types(model_cfg: ModelConfig) -> tuple[dict[str, type], str]:
    """The policy's module names and classes, from a skeleton on the meta device (no weights),
    and the output layer's name."""
    if model_cfg.path == "tiny":
        from pipeline.models.tiny import build_tiny

        model, _ = build_tiny(model_cfg.tiny)
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        path = os.path.expanduser(str(model_cfg.path))
        config = AutoConfig.from_pretrained(path, trust_remote_code=bool(model_cfg.trust_remote_code))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=bool(model_cfg.trust_remote_code))
    output = next(n for n, m in model.named_modules() if m is model.get_output_embeddings())
    return {name: type(m) for name, m in model.named_modules() if name}, output
