"""The trainer's forward: response log-probs (and entropy) of a micro-batch's rows, padded or
packed (``trainer.remove_padding``), and what the model is set up with before FSDP2 wraps it
(attention implementation, optional Liger kernels, the chunked log-prob head, which decoder layers
are checkpointed).

Row layout (``pipeline.algorithms.TrainBatch``): ``input_ids [B, P+R]`` with the prompt
left-padded into the first P columns and the response right-padded into the last R, so the
logits predicting the response are the last R+1 positions (``logits_to_keep``). Packed, the rows
of a micro-batch are one ``[1, T]`` row (``pipeline.algorithms.packing``) and the log-probs come
back in the padded ``[B, R]`` shape (zeros on padding), so the losses see one layout.
"""
from __future__ import annotations

import math
import types
import warnings
from typing import Any

import torch


def flag(name: str, value: Any, on_gpu: bool) -> bool:
    """An ``auto | true | false`` trainer key (auto: on GPU)."""
    text = str(value).lower()
    if text not in ("auto", "true", "false"):
        raise ValueError(f"trainer.{name}={value!r}: expected auto, true or false")
    return on_gpu if text == "auto" else text == "true"


def has_flash_attn() -> bool:
    try:
        import flash_attn  # noqa: F401
        return True
    except Exception:
        return False


def attention_implementation(requested: str, packed: bool, on_gpu: bool) -> str:
    """``trainer.attn_implementation`` resolved. auto: flash_attention_2 when flash-attn is
    installed on GPU (it reads the packed boundaries from the same keywords), else ``varlen``
    (pipeline/trainer/varlen.py) for packed rows and sdpa for padded ones."""
    from pipeline.trainer import varlen

    if requested == "auto":
        if on_gpu and has_flash_attn():
            return "flash_attention_2"
        requested = varlen.NAME if packed else "sdpa"
    if requested == varlen.NAME:
        if not packed:
            raise ValueError(f"trainer.attn_implementation={varlen.NAME} needs trainer.remove_padding "
                             "(it attends over packed rows only)")
        varlen.register()
    return requested


def apply_liger(model: torch.nn.Module) -> bool:
    """Liger's Triton RMSNorm, SwiGLU and RoPE on this model instance (``trainer.liger``), through
    its ``apply_liger_kernel_to_<model_type>(..., model=...)``; True when applied. Its fused linear
    cross-entropy is left off: the RL loss needs per-token log-probs and entropy, which verl's
    chunked head gives (``trainer.logprob_chunk_tokens``). Needs CUDA and ``liger-kernel``."""
    if not torch.cuda.is_available():
        warnings.warn("trainer.liger=true: Liger's kernels are Triton, for CUDA only; not applied on CPU")
        return False
    try:
        import liger_kernel.transformers as liger
    except ImportError:
        warnings.warn("trainer.liger=true but liger-kernel is not installed: not applied")
        return False
    model_type = model.config.model_type
    fn = getattr(liger, f"apply_liger_kernel_to_{model_type}", None)
    if fn is None:
        raise ValueError(f"trainer.liger=true: liger-kernel has no apply_liger_kernel_to_{model_type}")
    fn(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False,
       model=model)
    return True


def install_log_prob_head(model: torch.nn.Module, chunk_tokens: int, compiled: bool = False) -> None:
    """``model(input_ids, position_ids, targets, temperature, attention_mask=None,
    logit_index=None, **attention kwargs)`` -> (log-probs, entropy) of ``targets``.

    Padded (``logit_index`` None): ``targets [B, R]`` are the last R positions of ``input_ids``.
    Packed: ``logit_index [N]`` are the positions of the ``[1, T]`` row whose hidden states predict
    ``targets [1, N]``. verl's FusedLinearForPPO turns those hidden states into both, ``chunk_tokens``
    rows at a time, recomputing each chunk's logits in the backward: the [tokens, vocab] fp32 logits
    (20 GB for 32k tokens at Qwen's vocabulary) never exist. It runs inside the root module's own
    forward because that is where FSDP2 has gathered the root's parameters (lm_head, a tied embedding).
    ``compiled``: the same head with its chunk math under torch.compile (pipeline/trainer/head.py).
    """
    if compiled:
        from pipeline.trainer.head import CompiledLogProbHead

        head: torch.nn.Module = CompiledLogProbHead(chunk_tokens)
    else:
        from verl.utils.experimental.torch_functional import FusedLinearForPPO

        head = FusedLinearForPPO(chunk_size=chunk_tokens)

    def forward(self, input_ids, position_ids, targets, temperature, attention_mask=None,
                logit_index=None, **attn_kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False, **attn_kwargs).last_hidden_state
        if logit_index is None:  # position t predicts token t+1: the hidden states before each target
            hidden = hidden[:, -(targets.shape[1] + 1):-1, :]
        else:
            hidden = hidden[:, logit_index, :]
        logp, entropy = head(hidden, self.get_output_embeddings().weight, targets, temperature)
        return logp.clone(), entropy.clone()  # views out of an FSDP module lose its backward hook to in-place ops

    model.forward = types.MethodType(forward, model)


def trim(rows: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """Drop columns that are padding in every row of the micro-batch."""
    attn = rows["attention_mask"]
    R = rows["response_mask"].shape[1]
    P = attn.shape[1] - R
    has_tok = attn.bool().any(0)
    left = int(torch.nonzero(has_tok[:P])[0]) if has_tok[:P].any() else P
    resp_cols = torch.nonzero(has_tok[P:])
    r_keep = max(1, int(resp_cols[-1]) + 1 if len(resp_cols) else 1)
    out = {}
    for k, v in rows.items():
        out[k] = v[:, left:P + r_keep] if v.shape[1] == P + R else v[:, :r_keep]
    return out, r_keep


def log_probs(model: torch.nn.Module, mb: dict[str, torch.Tensor], device: torch.device,
              temperature: float, chunked: bool, packed: bool, with_entropy: bool):
    """(trimmed rows, log-probs ``[B, r]``, entropy ``[B, r]`` or None) of the response tokens,
    of ``logits / temperature`` (the sampler's log-probs are of those: like with like)."""
    mb, R = trim(mb)
    if packed:
        return (mb, *_packed(model, mb, device, temperature, chunked, with_entropy))
    ids = mb["input_ids"].to(device)
    kw = dict(attention_mask=mb["attention_mask"].to(device), position_ids=mb["position_ids"].to(device))
    if chunked:
        logp, ent = model(input_ids=ids, targets=ids[:, -R:], temperature=temperature, **kw)
        return mb, logp, (ent if with_entropy else None)
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=R + 1, **kw).logits
    logits = logits[:, :-1, :].float() / temperature
    return mb, *_from_logits(logits, ids[:, -R:], with_entropy)


def _packed(model, mb, device, temperature, chunked, with_entropy):
    from pipeline.algorithms.packing import pack

    R = mb["response_mask"].shape[1]
    p = pack(mb["input_ids"], mb["attention_mask"], mb["response_mask"], mb["input_ids"].shape[1] - R)
    index = p.logit_index[p.response_present].to(device)
    targets = p.response_ids[p.response_present].to(device)[None]
    kw = dict(input_ids=p.input_ids.to(device), position_ids=p.position_ids.to(device),
              # transformers hands these to every attention call (flash_attention_2 and varlen read them)
              cu_seq_lens_q=p.cu_seqlens.to(device), cu_seq_lens_k=p.cu_seqlens.to(device),
              max_length_q=p.max_seqlen, max_length_k=p.max_seqlen)
    if chunked:
        logp, ent = model(targets=targets, temperature=temperature, logit_index=index, **kw)
    else:
        logits = model(use_cache=False, logits_to_keep=index, **kw).logits.float() / temperature
        logp, ent = _from_logits(logits, targets, with_entropy)
    return p.unpack(logp[0]), (p.unpack(ent[0]) if with_entropy else None)


def _from_logits(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    return logprobs_from_logits(logits, targets), (entropy_from_logits(logits) if with_entropy else None)


def checkpoint_share(model: torch.nn.Module, share: float) -> None:
    """Recompute the activations of only the first ``share`` of the decoder layers: each layer
    checkpointed trades its stored activations for a second forward in backward, so a model that
    fits with a third of its layers checkpointed pays a third of the recomputation (transformers
    checks each layer's own ``gradient_checkpointing`` flag at every call)."""
    layers = decoder_layers(model)
    keep = math.ceil(share * len(layers))
    for i, layer in enumerate(layers):
        if hasattr(layer, "gradient_checkpointing"):
            layer.gradient_checkpointing = i < keep


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks FSDP wraps one by one (HF models name them via _no_split_modules)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"model {type(model).__name__} declares no _no_split_modules: cannot "
                         "tell its decoder layers apart for FSDP wrapping")
    return layers
