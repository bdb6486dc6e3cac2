"""Trainer throughput: tokens/s and MFU of one training step of a random-init Qwen2, padded rows
against packed rows, the model wrapped the way pipeline.trainer.worker wraps it (fp32 master
weights, FSDP2 ``fully_shard`` per decoder layer with a bf16 compute policy, AdamW).

Only real tokens count: padding is paid for but not credited. FLOPs of a sequence of length n:
6 * N_matmul * n (forward + backward of every linear layer, lm_head included, embedding lookup
not) + 6 * layers * hidden * n^2 (causal attention scores and values, forward + backward).
MFU = achieved FLOP/s over a peak (--peak-tflops, default the H200's 989 dense bf16 datasheet
figure); the run also measures a large bf16 matmul on the same GPU and reports MFU against it.

    python -m bench.trainer --preset qwen0.5b --out runs/bench/trainer.json      # the H200
    python -m bench.trainer --preset cpu-small --out runs/bench/trainer_cpu.json # a laptop

The project's RL step (``--rl-step``) has levers, one row per ``--rl-configs`` entry
``PRESET/LAYOUT[+compile][+chead][+liger][+ckpt]`` (LAYOUT padded | packed: ``trainer.remove_padding``;
``+compile``: ``trainer.compile_layers``; ``+chead``: ``trainer.compile_head``; ``+liger``: ``trainer.liger``; ``+ckpt``:
``trainer.gradient_checkpointing``), or a named set of ``bench.trainer_rl.LEVER_SETS`` (``levers``,
``levers-head``, ``levers-liger``, ``levers-scale``: each fits one 8-minute device call). Liger patches
transformers' Qwen2 module for the whole process, so its rows run after all the others.

    python -m bench.trainer --preset qwen0.5b --rows 64 --layouts "" --rl-step --rl-budgets 32768 \
        --rl-configs levers --time-limit-s 330 --out $OUT/trainer_levers.json   # the H200
"""
from __future__ import annotations

import os
import random
import time
from typing import Any

import torch

from bench.common import parser, progress, report, target

PRESETS: dict[str, dict[str, Any]] = {
    # Qwen2.5-0.5B's shape
    "qwen0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                     num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    # Qwen2.5-1.5B's shape
    "qwen1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                     num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    # Qwen2.5-3B's shape
    "qwen3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                   num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True),
    "cpu-small": dict(vocab_size=4096, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}


def build_model(arch: dict[str, Any], device: torch.device, attn: str,
                compile_layers: bool = False) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**arch, max_position_embeddings=32768, architectures=["Qwen2ForCausalLM"])
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(torch.float32)
    model.config.use_cache = False
    on_gpu = device.type == "cuda"
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if on_gpu else torch.float32,
                                  reduce_dtype=torch.float32)
    mesh = init_device_mesh(device.type, (1,))
    for layer in model.model.layers:
        if compile_layers:  # per block, as torchtitan does with FSDP2: fuses norms, rotary, SiLU, casts
            layer.compile()
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.train()
    return model


def matmul_params(model: torch.nn.Module) -> int:
    """Weights that take part in a matmul per token: every nn.Linear (lm_head too, even tied)."""
    return sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))


def make_micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Greedy in arrival order: rows join a micro-batch while its *padded* size fits the budget,
    so padded and packed see the same rows per micro-batch and differ only in layout."""
    out: list[list[int]] = [[]]
    for n in lengths:
        cur = out[-1]
        if cur and max(cur + [n]) * (len(cur) + 1) > budget:
            out.append([])
        out[-1].append(n)
    return out


def layout(lens: list[int], vocab: int, packed: bool, device: torch.device) -> dict[str, torch.Tensor]:
    seqs = [torch.randint(0, vocab, (n,)) for n in lens]
    if packed:
        ids = torch.cat(seqs)[None]
        pos = torch.cat([torch.arange(n) for n in lens])[None]
        labels = torch.cat([torch.cat([s[1:], torch.tensor([-100])]) for s in seqs])[None]
        return {"input_ids": ids.to(device), "position_ids": pos.to(device), "labels": labels.to(device)}
    L = max(lens)
    ids = torch.zeros(len(lens), L, dtype=torch.long)
    mask = torch.zeros(len(lens), L, dtype=torch.long)
    labels = torch.full((len(lens), L), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
        labels[i, :len(s) - 1] = s[1:]
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": pos.to(device),
            "labels": labels.to(device)}


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, micro: list[dict[str, torch.Tensor]]) -> float:
    total = sum(int((m["labels"] != -100).sum()) for m in micro)
    loss_sum = 0.0
    for m in micro:
        labels = m["labels"]
        kwargs = {k: v for k, v in m.items() if k != "labels"}
        logits = model(**kwargs, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(),
                                                 ignore_index=-100, reduction="sum") / total
        loss.backward()
        loss_sum += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss_sum


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def profile_step(model: torch.nn.Module, opt: torch.optim.Optimizer, micro: list[dict[str, torch.Tensor]],
                 device: torch.device, path: str) -> None:
    profile_call(lambda: step(model, opt, micro), device, path)


def profile_call(fn: Any, device: torch.device, path: str) -> None:
    """One step under torch.profiler: is the step bound by the GPU's kernels or by the host
    (launches, syncs, FSDP bookkeeping)? Writes the top of the kernel table and the busy share."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        fn()
        sync(device)
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events) if device.type == "cuda" else 0.0
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    text = (f"profiled step wall {wall:.3f} s (profiler on), GPU kernel time {gpu_us / 1e6:.3f} s "
            f"({gpu_us / 1e6 / wall:.0%} busy)\n" + events.table(sort_by=sort, row_limit=25, max_name_column_width=70))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(text[:2500], flush=True)


def matmul_tflops(device: torch.device, n: int = 8192, reps: int = 10) -> float | None:
    if device.type != "cuda":
        return None
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (start.elapsed_time(end) / 1e3) / 1e12


def save_partial(args: Any, rows: list[dict[str, Any]]) -> None:
    """The rows so far, to --out: a device call cut at its limit keeps what it measured."""
    if args.out:
        import json

        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"bench": "trainer", "partial": True, "rows": rows}, f, indent=2, default=str)


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="qwen0.5b")
    p.add_argument("--rows", type=int, default=64, help="sequences per training step")
    p.add_argument("--min-len", type=int, default=256)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--token-budget", type=int, default=8192,
                   help="padded tokens per micro-batch (32768 ran out of the H200's memory at vocab 151936)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per layout")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak used for MFU")
    p.add_argument("--layouts", default="padded,packed")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each decoder layer (the bench loop, and the rl step through "
                        "trainer.compile_layers)")
    p.add_argument("--rl-step", action="store_true", help="also time the project's trainer step")
    p.add_argument("--rl-budgets", default="", help="micro-batch token budgets of the rl steps (default --token-budget)")
    p.add_argument("--rl-chunks", default="1024", help="logprob_chunk_tokens of the rl steps (0: full logits)")
    p.add_argument("--rl-configs", default="", help="rl-step rows: PRESET/LAYOUT[+compile][+chead][+liger][+ckpt], "
                   "comma-separated, or a named set (levers); default: --preset, padded, --compile")
    p.add_argument("--time-limit-s", type=float, default=0.0, help="start no rl-step row after this many "
                   "seconds (the rows left are listed as skipped; 0: no limit)")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--rl-profile", default="", help="a directory: one more step of each rl-step row under "
                   "torch.profiler, its kernel table written there as <row>.txt (after the timed steps)")
    p.add_argument("--profile", default="", help="write a torch.profiler summary of one step of the first "
                   "layout to this file (GPU busy time against wall time, the top kernels)")
    args = p.parse_args()

    import torch.distributed as dist

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    arch = PRESETS[args.preset]
    model = build_model(arch, device, args.attn, args.compile)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    n_mm = matmul_params(model)
    n_params = sum(p.numel() for p in model.parameters())
    L, d = arch["num_hidden_layers"], arch["hidden_size"]
    rng = random.Random(0)
    lengths = [rng.randint(args.min_len, args.max_len) for _ in range(args.rows)]
    flops = sum(6 * n_mm * n + 6 * L * d * n * n for n in lengths)
    real_tokens = sum(lengths)
    micro_lens = make_micro_batches(lengths, args.token_budget)
    padded_tokens = sum(max(m) * len(m) for m in micro_lens)
    peak_measured = matmul_tflops(device)
    rows = []
    for name in [x for x in args.layouts.split(",") if x]:  # --layouts "": the rl step alone
        packed = name == "packed"
        micro = [layout(m, arch["vocab_size"], packed, device) for m in micro_lens]
        for _ in range(args.warmup):
            step(model, opt, micro)
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step(model, opt, micro)
            sync(device)
            times.append(time.perf_counter() - t0)
        t = sorted(times)[len(times) // 2]
        if args.profile and not rows:
            profile_step(model, opt, micro, device, args.profile)
        achieved = flops / t / 1e12
        row = {"layout": f"{name} (bench loop)", "step_s": t, "tokens_per_s": real_tokens / t, "TFLOP/s": achieved,
               "mfu_vs_peak": achieved / args.peak_tflops if device.type == "cuda" else None,
               "mfu_vs_matmul": achieved / peak_measured if peak_measured else None,
               "micro_batches": len(micro),
               "computed_tokens": padded_tokens if not packed else real_tokens}
        if device.type == "cuda":
            row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        rows.append(row)
        progress("trainer", row)
        del micro
    if args.rl_step:
        from torch import _dynamo

        from bench.trainer_rl import parse_levers, rl_label, rl_step

        dist.destroy_process_group()
        del model, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()
        t_start = time.perf_counter()
        for lever in parse_levers(args.rl_configs, args.preset, args.compile):
            for budget in [int(b) for b in (args.rl_budgets or str(args.token_budget)).split(",")]:
                for chunk in [int(c) for c in args.rl_chunks.split(",")]:
                    label = rl_label(budget, chunk, lever)
                    if args.time_limit_s and time.perf_counter() - t_start > args.time_limit_s:
                        rows.append({"layout": label, "error": "skipped: --time-limit-s reached"})
                        continue
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats()
                    # each row compiles afresh: dynamo keeps its compiled variants per code object
                    # (the decoder layer's forward is one for every model size), and past
                    # recompile_limit (8) it runs new ones eagerly. A 3B row run third
                    # (after 1.5B and 0.5B in the same process) hit that limit.
                    _dynamo.reset()
                    t_row = time.perf_counter()
                    try:
                        rows.append(rl_step(args, PRESETS[lever["preset"]], lengths, device, budget, chunk, lever))
                    except Exception as e:  # the rows before are still worth reporting; the error is shown
                        rows.append({"layout": label, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                        if dist.is_initialized():
                            dist.destroy_process_group()
                    rows[-1]["row_wall_s"] = time.perf_counter() - t_row
                    progress("trainer", rows[-1])
                    save_partial(args, rows)
    best = max((r.get("mfu_vs_peak") or 0.0) for r in rows)  # an error row has none
    extra = {"matmul_params": n_mm, "params": n_params,
             "real_tokens_per_step": real_tokens, "padded_tokens_per_step": padded_tokens,
             "padding_waste": 1 - real_tokens / padded_tokens, "flops_per_step": flops,
             "peak_tflops_used": args.peak_tflops, "matmul_tflops_measured": peak_measured,
             "target_mfu_45pct": target(best >= 0.45 if device.type == "cuda" else None)}
    report("trainer", args, rows, extra)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
