"""Packed form of training rows: no padding, one ``[1, T]`` sequence per micro-batch, for
variable-length attention.

Sequences are concatenated (prompt + response, padding removed); ``position_ids`` restart at 0
for each, which is how HF models find the boundaries (flash-attention varlen, and the sdpa/eager
masks built by ``transformers.masking_utils``, which look for packing only when the forward gets
no attention mask and no cache: call ``model(input_ids=..., position_ids=..., use_cache=False)``).
``cu_seqlens``
and ``max_seqlen`` are the flash-attention varlen arguments for code that calls it directly.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pipeline.algorithms.batch import TrainBatch


@dataclass
class PackedRows:
    rows: list[int]               # batch rows packed, in order
    input_ids: torch.Tensor       # [1, T] long
    position_ids: torch.Tensor    # [1, T] long, 0.. per sequence
    cu_seqlens: torch.Tensor      # [n+1] int32: sequence i is tokens [cu[i], cu[i+1])
    max_seqlen: int
    logit_index: torch.Tensor     # [n, R] long: packed position whose logits predict response token j
    response_ids: torch.Tensor    # [n, R] long: the response tokens (pad where response_mask is 0)
    response_mask: torch.Tensor   # [n, R] float, the batch's loss mask of these rows

    def gather(self, per_position: torch.Tensor) -> torch.Tensor:
        """``[1, T, ...]`` values at every packed position (e.g. logits) -> ``[n, R, ...]`` at the
        positions predicting each row's response tokens (padding slots repeat position 0)."""
        return per_position[0, self.logit_index]


def pack_rows(batch: TrainBatch, rows: Sequence[int] | None = None) -> PackedRows:
    """Pack ``rows`` (default: all) of a right/left-padded :class:`TrainBatch`."""
    rows = list(range(len(batch))) if rows is None else [int(r) for r in rows]
    P, R = batch.prompt_len, batch.response_len
    resp_present = batch.attention_mask[:, P:].bool()
    ids, pos, starts, lengths = [], [], [0], []
    logit_index = torch.zeros(len(rows), R, dtype=torch.long)
    for k, r in enumerate(rows):
        keep = batch.attention_mask[r].bool()
        seq = batch.input_ids[r][keep]
        n_prompt = int(keep[:P].sum())
        n_resp = int(resp_present[r].sum())
        if n_prompt == 0:
            raise ValueError(f"row {r} ({batch.uids[r]!r}) has no prompt token: nothing predicts its "
                             "first response token")
        offset = starts[-1]
        # response token j sits at n_prompt + j; its logits come from the position before it
        logit_index[k, :n_resp] = offset + n_prompt - 1 + torch.arange(n_resp)
        ids.append(seq)
        pos.append(torch.arange(seq.numel()))
        lengths.append(seq.numel())
        starts.append(offset + seq.numel())
    idx = torch.tensor(rows, dtype=torch.long)
    return PackedRows(
        rows=rows, input_ids=torch.cat(ids).unsqueeze(0), position_ids=torch.cat(pos).unsqueeze(0),
        cu_seqlens=torch.tensor(starts, dtype=torch.int32), max_seqlen=max(lengths),
        logit_index=logit_index, response_ids=batch.input_ids[idx, P:],
        response_mask=batch.response_mask[idx])
