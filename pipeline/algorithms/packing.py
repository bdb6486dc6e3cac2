"""Packed form of training rows: no padding, one ``[1, T]`` sequence per micro-batch, for
variable-length attention (the trainer's ``trainer.remove_padding``, verl's ``use_remove_padding``).

Sequences are concatenated (prompt + response, padding removed); ``position_ids`` restart at 0
for each, which is how HF models find the boundaries (flash-attention varlen, and the sdpa/eager
masks built by ``transformers.masking_utils``, which look for packing only when the forward gets
no attention mask and no cache: call ``model(input_ids=..., position_ids=..., use_cache=False)``).
``cu_seqlens`` and ``max_seqlen`` are the varlen kernels' arguments (flash-attn, torch's
``varlen_attn``); the trainer passes them as transformers' ``cu_seq_lens_*`` / ``max_length_*``.

Written here because no library packs this project's row layout (prompt left-padded into the
first P columns, response right-padded into the last R); the rest is transformers' and torch's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedRows:
    input_ids: torch.Tensor       # [1, T] long
    position_ids: torch.Tensor    # [1, T] long, 0.. per sequence
    cu_seqlens: torch.Tensor      # [n+1] int32: sequence i is tokens [cu[i], cu[i+1])
    max_seqlen: int
    logit_index: torch.Tensor     # [n, R] long: packed position whose logits predict response token j
    response_present: torch.Tensor  # [n, R] bool: response token j of the row exists (not padding)
    response_ids: torch.Tensor    # [n, R] long: the response tokens (pad where response_mask is 0)
    response_mask: torch.Tensor   # [n, R] float, the batch's loss mask of these rows

    def gather(self, per_position: torch.Tensor) -> torch.Tensor:
        """``[1, T, ...]`` values at every packed position (e.g. logits) -> ``[n, R, ...]`` at the
        positions predicting each row's response tokens (padding slots repeat position 0)."""
        return per_position[0, self.logit_index]

    def unpack(self, flat: torch.Tensor) -> torch.Tensor:
        """``[N]`` values of the present response tokens, in packed order (what
        ``logit_index[response_present]`` selects) -> ``[n, R]`` with zeros on padding."""
        out = flat.new_zeros(self.response_present.shape)
        out[self.response_present] = flat
        return out


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor,
         prompt_len: int) -> PackedRows:
    """Pack ``[n, P+R]`` rows laid out as ``TrainBatch`` rows (``prompt_len`` = P)."""
    P = prompt_len
    keep = attention_mask.bool()
    lengths = keep.sum(1)
    n_prompt = keep[:, :P].sum(1)
    if bool((n_prompt == 0).any()):
        r = int(torch.nonzero(n_prompt == 0)[0])
        raise ValueError(f"row {r} has no prompt token: nothing "
                         "predicts its first response token")
    ends = lengths.cumsum(0)
    starts = ends - lengths
    T = int(ends[-1]) if len(ends) else 0
    # position t of the packed row is token t - starts[its sequence] of that sequence
    positions = torch.arange(T) - torch.repeat_interleave(starts, lengths)
    present = keep[:, P:]
    R = present.shape[1]
    # response token j sits at start + n_prompt + j; its logits come from the position before it
    logit_index = (starts + n_prompt - 1)[:, None] + torch.arange(R)[None, :]
    logit_index = torch.where(present, logit_index, torch.zeros_like(logit_index))
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = ends.to(torch.int32)
    return PackedRows(
        input_ids=input_ids[keep].unsqueeze(0), position_ids=positions.unsqueeze(0),
        cu_seqlens=cu, max_seqlen=int(lengths.max()) if len(lengths) else 0,
        logit_index=logit_index, response_present=present, response_ids=input_ids[:, P:],
        response_mask=response_mask)

