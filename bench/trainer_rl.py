"""The project's own RL step (``pipeline.trainer.worker.TrainerWorker.train_step``) for
``bench.trainer --rl-step``, one row per lever set: the layout (``trainer.remove_padding``),
``trainer.compile_layers``, ``trainer.compile_head`` (``+chead``), ``trainer.liger`` and
``trainer.gradient_checkpointing``, at a preset's shape. Counted as in bench/trainer.py: real
tokens only, 6 (8 with the old-log-prob forward) x (N_matmul x n + layers x hidden x n^2) per
sequence.
"""
from __future__ import annotations

import os
import random
import re
import time
from typing import Any

import torch

from bench.trainer import PRESETS, matmul_params, sync


def rl_step(args: Any, arch: dict[str, Any], lengths: list[int], device: torch.device, budget: int,
            chunk: int, lever: dict[str, Any] | None = None) -> dict[str, Any]:
    """The project's own trainer step (pipeline.trainer.worker.TrainerWorker.train_step) on a
    GRPO+ batch built by pipeline.algorithms.build_train_batch from synthetic samples: prompt
    ``--prompt-len`` tokens, responses of the lengths above, 8 samples per task, random scores.
    Its work per row: forward + backward, and a forward for the old log-probs of the rows after
    the first mini-batch."""
    from bench.weight_push import group
    from pipeline.algorithms import build_train_batch
    from pipeline.algorithms.config import AlgorithmConfig
    from pipeline.models.config import ModelConfig
    from pipeline.sample import Sample
    from pipeline.trainer import TrainerConfig, TrainerWorker, varlen
    from pipeline.trainer.plan import plan_step
    from pipeline.trainer.worker import free_port

    over = {f"tiny.{k}": v for k, v in arch.items()}
    over["tiny.max_position_embeddings"] = 32768
    model_cfg = group(ModelConfig, "model/tiny", **over)
    algo = group(AlgorithmConfig, "algorithm/grpo_plus", micro_batch_tokens=budget)
    max_resp = max(lengths)
    lever = lever or parse_levers("", "", args.compile)[0]
    trainer_cfg = group(TrainerConfig, "trainer/fsdp2", logprob_chunk_tokens=chunk, compile_layers=lever["compile"],
                        compile_head=lever["chead"],
                        remove_padding=str(lever["layout"] == "packed").lower(), liger=lever["liger"],
                        gradient_checkpointing=lever["ckpt"], gradient_checkpointing_share=lever["ckpt_share"])
    worker = TrainerWorker(0, 1, model_cfg, trainer_cfg, algo,
                           max_response_length=max_resp, temperature=1.0, total_optim_steps=100)
    info = worker.init("127.0.0.1", free_port())
    rng = random.Random(1)
    vocab = arch["vocab_size"]
    samples = [Sample(uid=f"0/t{i // 8}/{i % 8}/0", step=0, task_id=f"t{i // 8}", traj=i % 8, turn=0,
                      prompt_ids=[rng.randrange(vocab) for _ in range(args.prompt_len)],
                      response_ids=[rng.randrange(vocab) for _ in range(r)], logprobs=[-5.0] * r,
                      finish_reason="stop", score=rng.random(), policy_version=0)
               for i, r in enumerate(lengths)]
    batch = build_train_batch(samples, algo, max_resp, 0)
    n_rows = int(batch.input_ids.shape[0])
    lens = [int(x) for x in batch.attention_mask.sum(1)]
    plan = plan_step(lens, [int(x) for x in batch.response_mask.sum(1)], 1, algo.ppo_mini_batches,
                     algo.micro_batch_tokens)
    from pipeline.trainer.worker import BATCH_KEYS

    shard = {k: getattr(batch, k)[torch.tensor(plan.ranks[0].rows)] for k in BATCH_KEYS}
    times = []
    for i in range(args.warmup + args.steps):
        sync(device)
        t0 = time.perf_counter()
        worker.train_step(shard, plan.ranks[0], plan.global_seqs, plan.global_tokens, max_resp)
        sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    if getattr(args, "rl_profile", ""):  # after the timed steps: the profiler's overhead is not timed
        from bench.trainer import profile_call

        name = re.sub(r"[^A-Za-z0-9_.+-]+", "_", rl_label(budget, chunk, lever))
        profile_call(lambda: worker.train_step(shard, plan.ranks[0], plan.global_seqs, plan.global_tokens, max_resp),
                     device, os.path.join(args.rl_profile, f"{name}.txt"))
    worker.shutdown()
    t = sorted(times)[len(times) // 2]
    L, d, V = arch["num_hidden_layers"], arch["hidden_size"], arch["vocab_size"]
    n_body = matmul_params(worker.model) - V * d
    resp = [int(x) for x in batch.response_mask.sum(1)]
    # forward + backward (3 passes' worth per token), and one forward more for the old log-probs
    # of the rows after the first mini-batch (the first trains on the weights they come from);
    # lm_head only on the response positions (logits_to_keep)
    rank = plan.ranks[0]
    later = {rank.rows[p] for mini in rank.mini_batches[1:] for micro in mini for p in micro}
    flops = sum((8 if i in later else 6) * (n_body * n + V * d * r + L * d * n * n)
                for i, (n, r) in enumerate(zip(lens, resp)))
    # what the forwards ran over: each micro-batch padded to its longest row, or packed (real tokens)
    P = batch.prompt_len
    p_lens, r_lens = batch.attention_mask[:, :P].sum(1).tolist(), batch.attention_mask[:, P:].sum(1).tolist()
    computed = sum(len(micro) * (max(p_lens[rank.rows[p]] for p in micro) + max(r_lens[rank.rows[p]] for p in micro))
                   for mini in rank.mini_batches for micro in mini) if not info["remove_padding"] else sum(lens)
    achieved = flops / t / 1e12
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    return {"layout": rl_label(budget, chunk, lever), "step_s": t, "tokens_per_s": sum(lens) / t,
            "TFLOP/s": achieved, "mfu_vs_peak": achieved / args.peak_tflops if device.type == "cuda" else None,
            "micro_batches": sum(len(m) for m in plan.ranks[0].mini_batches), "computed_tokens": computed,
            "rows": n_rows, "peak_mem_gib": peak, "attn": info["attn_implementation"], "liger": info["liger"],
            "compile_head": info["compile_head"],
            "varlen_kernel": varlen.kernel_available(device, torch.bfloat16) if info["remove_padding"] else None,
            "params": info["params"]}


def rl_label(budget: int, chunk: int, lever: dict[str, Any]) -> str:
    share = lever.get("ckpt_share", 1.0)
    extras = [f"ckpt{round(share * 100)}" if k == "ckpt" and share < 1 else k for k in FLAGS if lever.get(k)]
    return (f"rl_step {lever.get('preset', '')}/{lever['layout']}{''.join('+' + k for k in extras)} "
            f"(budget {budget}, logprob chunk {chunk or 'off'})")


# a row's levers after PRESET/LAYOUT, in label order: trainer.compile_layers, trainer.compile_head,
# trainer.liger, trainer.gradient_checkpointing
FLAGS = ("compile", "chead", "liger", "ckpt")

# the lever matrix at a 32k-token budget, split so that each set fits one 8-minute device call
# (a compiled row costs ~1.5-2.5 min with its compile; the padded baselines at 0.5B, eager and
# compiled, were measured on the H200 on 2026-12-03: 11.8 % and 14.1 % MFU); within a set, the most telling row first
LEVER_SETS = {
    "levers": ["qwen1.5b/packed+compile", "qwen0.5b/packed+compile", "qwen1.5b/packed", "qwen0.5b/packed"],
    # the compiled log-prob head beside the best rows without it (the same call, side by side)
    "levers-head": ["qwen1.5b/packed+compile+chead", "qwen1.5b/packed+compile", "qwen0.5b/packed+compile+chead",
                     "qwen0.5b/packed+compile"],
    "levers-liger": ["qwen1.5b/packed+compile+liger", "qwen0.5b/packed+compile+liger", "qwen1.5b/packed+liger"],
    "levers-scale": ["qwen3b/packed+compile+ckpt", "qwen3b/packed+compile", "qwen1.5b/packed+compile+ckpt",
                      "qwen1.5b/padded+compile"],
}


def parse_levers(spec: str, default_preset: str, compiled: bool) -> list[dict[str, Any]]:
    """``--rl-configs`` -> one dict per row (preset, layout, compile, chead, liger, ckpt); liger rows last."""
    if not spec:
        row = dict(preset=default_preset, layout="padded", ckpt_share=1.0, **dict.fromkeys(FLAGS, False))
        row["compile"] = compiled
        return [row]
    items = [x for name in spec.split(",") for x in LEVER_SETS.get(name, [name]) if x]
    out = []
    for item in items:
        preset, _, rest = item.partition("/")
        layout, *flags = (rest or "padded").split("+")
        share = 1.0
        for i, f in enumerate(flags):  # ckptNN: checkpoint the first NN % of the decoder layers
            if f.startswith("ckpt") and f[4:].isdigit():
                share, flags[i] = int(f[4:]) / 100, "ckpt"
        if preset not in PRESETS or layout not in ("padded", "packed") or \
                set(flags) - set(FLAGS) or not 0 < share <= 1:
            raise SystemExit(f"--rl-configs entry {item!r}: expected PRESET/LAYOUT{''.join(f'[+{f}]' for f in FLAGS)} "
                             f"(ckptNN: the first NN % of the layers) with PRESET in {sorted(PRESETS)} and LAYOUT padded or packed, or one of "
                             f"{sorted(LEVER_SETS)}")
        out.append(dict(preset=preset, layout=layout, ckpt_share=share, **{f: f in flags for f in FLAGS}))
    return sorted(out, key=lambda lv: lv["liger"])  # stable: the given order within each group
