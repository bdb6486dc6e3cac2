"""Supervised conversations for ``python -m pipeline.sft``: the task prompt exactly as the kernel
environment builds it for turn 1 (``KernelEnv.messages(task, [])``, rendered through the model's
chat template) -> an assistant answer in the format the environment parses (a short summary, then
one fenced python block), rows laid out as the RL trainer's ``TrainBatch`` with the loss mask on
the assistant tokens (and the closing end-of-turn token, so the model learns to stop).

Two sources: the built-in answer corpus (``rewards.corpus``: several variants per task) or a JSONL
file of ``{"task": <task id>, "response": <assistant text>}`` rows (KernelBook-style pairs a user
brings). Bad rows fail with the file, the line and the field.
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.algorithms.batch import TrainBatch


@dataclass(frozen=True)
class Conversation:
    task_id: str
    response: str     # the assistant's text: summary + code block
    label: str = ""   # where it came from (corpus variant, or file:line)


class DataError(ValueError):
    """A bad SFT data file or row; the message names the file, the line and the field."""


def answer_text(code: str, summary: str) -> str:
    """An assistant answer in the environment's format (rewards/parse.py)."""
    return f"{summary.strip()}\n\n```python\n{code.rstrip()}\n```"


def _summary(code: str, variant: str) -> str:
    """The answer's own module docstring (what its kernel does), else a line naming the variant."""
    try:
        doc = ast.get_docstring(ast.parse(code))
    except SyntaxError:  # a corpus answer meant not to compile may still fail Python's parser
        doc = None
    first = (doc or "").strip().splitlines()
    return first[0] if first else f"A {variant} C++ kernel for this operator."


def corpus_conversations(backend: str, task_ids: list[str] | None = None,
                         variants: list[str] | None = None,
                         weights: dict[str, int] | None = None) -> list[Conversation]:
    """One conversation per corpus answer of ``backend`` (only ``task_ids``/``variants`` when given),
    repeated ``weights[variant]`` times where given (0 drops the variant)."""
    from rewards.corpus import corpus_answers

    answers = corpus_answers(backend, task_ids)
    if variants:
        answers = [a for a in answers if a.variant in variants]
    weights = weights or {}
    answers = [a for a in answers for _ in range(weights.get(a.variant, 1))]
    if not answers:
        raise DataError(f"the built-in corpus has no {backend} answers for tasks={task_ids} "
                        f"variants={variants} variant_weights={weights}")
    return [Conversation(a.task_id, answer_text(a.code, _summary(a.code, a.variant)),
                         f"corpus:{a.task_id}:{a.variant}") for a in answers]


def jsonl_conversations(path: str | Path, known_tasks: set[str]) -> list[Conversation]:
    """Rows ``{"task": <task id>, "response": <assistant text>}``; every error names the line."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"sft.data={str(path)!r}: no such file (expected JSONL rows "
                        '{"task": <task id>, "response": <assistant text>})')
    out = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected an object with fields task and response, "
                                f"got {type(row).__name__}")
            for key in ("task", "response"):
                if not isinstance(row.get(key), str) or not row[key].strip():
                    raise DataError(f"{where}: field {key!r} is missing or not a non-empty string")
            if row["task"] not in known_tasks:
                raise DataError(f"{where}: field 'task' = {row['task']!r} is not a task of the kernel "
                                f"environment (e.g. {sorted(known_tasks)[:3]}; see python -m rewards.cli tasks)")
            out.append(Conversation(row["task"], row["response"], where))
    if not out:
        raise DataError(f"{path}: no rows")
    return out


def _longs(xs: list[int]) -> torch.Tensor:
    return torch.from_numpy(np.asarray(xs, dtype=np.int64))


def tokenize(conversations: list[Conversation], env: Any, tokenizer: Any,
             max_prompt_length: int, max_response_length: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids + end of turn) per conversation, as the sampler tokenises them."""
    from rewards.interface import TaskRef
    from rewards.prompts import render

    rows = []
    for c in conversations:
        prompt = render(tokenizer, env.messages(TaskRef(c.task_id, env.task(c.task_id)), []))
        p = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        r = list(tokenizer(c.response, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
        if len(p) > max_prompt_length:
            raise DataError(f"{c.label}: the prompt has {len(p)} tokens, over rollout.max_prompt_length="
                            f"{max_prompt_length}")
        if len(r) > max_response_length:
            raise DataError(f"{c.label}: the answer has {len(r)} tokens, over sft.max_response_length="
                            f"{max_response_length}")
        rows.append((p, r))
    return rows


def sft_batch(rows: list[tuple[list[int], list[int]]], pad_token_id: int) -> TrainBatch:
    """``TrainBatch`` layout (prompt left-padded into P columns, response right-padded into R),
    loss mask on the response; the RL-only fields are zeros."""
    P = max(len(p) for p, _ in rows)
    R = max(len(r) for _, r in rows)
    B = len(rows)
    ids = torch.full((B, P + R), pad_token_id, dtype=torch.long)
    attn = torch.zeros(B, P + R, dtype=torch.long)
    mask = torch.zeros(B, R)
    for b, (p, r) in enumerate(rows):
        ids[b, P - len(p):P] = _longs(p)
        ids[b, P:P + len(r)] = _longs(r)
        attn[b, P - len(p):P + len(r)] = 1
        mask[b, :len(r)] = 1.0
    zeros = torch.zeros(B, R)
    return TrainBatch(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0),
                      response_mask=mask, advantages=zeros, sampler_log_probs=zeros.clone(),
                      truncated=torch.zeros(B, dtype=torch.bool), returns=torch.zeros(B),
                      scores=torch.zeros(B), group_ids=[""] * B, uids=[str(i) for i in range(B)],
                      prompt_len=P)
