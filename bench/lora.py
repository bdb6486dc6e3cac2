"""LoRA against full fine-tuning in the project's trainer (``trainer.lora``): trainable
parameters, AdamW state, RL step time and the merged weight export, on one FSDP2 rank.

Each row is a real :class:`~pipeline.trainer.worker.TrainerWorker` (gloo on CPU, one rank) over a
random tiny Qwen2 of the given shape, taking ``--steps`` RL steps on the same synthetic batch
(the first is warm-up and not timed). ``export_s`` is one ``exported_state_dict()`` (with LoRA:
every wrapped weight merged, W + scale * B @ A).

    python -m bench.lora --out bench/baselines/cpu/lora.json        # a CPU box
    python -m bench.lora --shapes qwen0.5b,qwen1.5b --ranks 0,16 --out lora.json   # one GPU (bf16)

The ``qwen*`` shapes are Qwen2.5-Coder-0.5B / 1.5B's architecture (layers, widths, heads, vocab),
randomly initialised: memory and time do not depend on the weights' values. On a GPU each row also
reports the step's peak allocated and reserved memory (the trainer's own ``perf/`` metrics).
"""
from __future__ import annotations

import statistics
import time

import torch

from bench.common import parser, progress, report

SHAPES = {  # model.tiny keys
    "tiny": {},  # conf/model/tiny.yaml: 2 layers, hidden 64
    "small": {"tiny.hidden_size": 256, "tiny.intermediate_size": 704, "tiny.num_hidden_layers": 4,
              "tiny.vocab_size": 2048},
    # Qwen2.5-Coder-0.5B/1.5B-Instruct's config.json (tied embeddings as there)
    "qwen0.5b": {"tiny.hidden_size": 896, "tiny.intermediate_size": 4864, "tiny.num_hidden_layers": 24,
                 "tiny.num_attention_heads": 14, "tiny.num_key_value_heads": 2, "tiny.vocab_size": 151936,
                 "tiny.tie_word_embeddings": True},
    "qwen1.5b": {"tiny.hidden_size": 1536, "tiny.intermediate_size": 8960, "tiny.num_hidden_layers": 28,
                 "tiny.num_attention_heads": 12, "tiny.num_key_value_heads": 2, "tiny.vocab_size": 151936,
                 "tiny.tie_word_embeddings": True},
}


def run_row(shape: str, rank: int, steps: int) -> dict:
    from pipeline.algorithms import AlgorithmConfig, build_train_batch
    from pipeline.models import ModelConfig
    from pipeline.models.load import load_tokenizer
    from pipeline.trainer import TrainerConfig, TrainerWorker
    from pipeline.trainer.worker import free_port
    from tests.pipeline.conftest import group
    from tests.pipeline.trainer.test_trainer import MAX_RESPONSE, make_samples, one_rank_step

    on_gpu = torch.cuda.is_available()
    model_cfg = group(ModelConfig, "model/tiny", **SHAPES[shape], **({"dtype": "bfloat16"} if on_gpu else {}))
    trainer_cfg = group(TrainerConfig, "trainer/fsdp2", **{"optim.lr": 1e-4, "optim.warmup_ratio": 0.0,
                                                           "lora.rank": rank})
    algo = group(AlgorithmConfig, "algorithm/grpo_plus", **{"ppo_mini_batches": 2, "micro_batch_tokens": 256})
    if on_gpu:  # each row's own peak (an earlier row's memory is freed below)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    tok = load_tokenizer(model_cfg)  # the worker builds the model: once, not here too
    batch = build_train_batch(make_samples(len(tok), n_tasks=4, n_traj=4), algo, MAX_RESPONSE, tok.pad_token_id)
    plan, shard = one_rank_step(batch, algo)
    w = TrainerWorker(0, 1, model_cfg, trainer_cfg, algo, MAX_RESPONSE, temperature=1.0,
                      total_optim_steps=2 * steps)
    info = w.init("127.0.0.1", free_port())
    try:
        times, metrics = [], {}
        for _ in range(steps):
            t0 = time.perf_counter()
            metrics = w.train_step(shard, plan.ranks[0], plan.global_seqs, plan.global_tokens, MAX_RESPONSE) or {}
            times.append(time.perf_counter() - t0)
        optim_bytes = sum(t.numel() * t.element_size() for s in w.optimizer.state.values()
                          for t in s.values() if torch.is_tensor(t))
        t0 = time.perf_counter()
        w.exported_state_dict()
        export_s = time.perf_counter() - t0
    finally:
        w.shutdown()
        del w
        import gc

        gc.collect()
    return {"shape": shape, "lora_rank": rank, "params": info["params"],
            "trainable_params": info["trainable_params"],
            "trainable_share": info["trainable_params"] / info["params"],
            "optim_state_mb": optim_bytes / 2**20,
            "step_s_median": statistics.median(times[1:]), "export_s": export_s,
            "device": info.get("device_name") or "cpu", "dtype": str(model_cfg.dtype),
            "peak_allocated_gb": metrics.get("perf/max_memory_allocated_gb"),
            "peak_reserved_gb": metrics.get("perf/max_memory_reserved_gb")}


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="tiny,small")
    p.add_argument("--ranks", default="0,8", help="trainer.lora.rank per row (0: full fine-tuning)")
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        for rank in (int(r) for r in args.ranks.split(",")):
            rows.append(run_row(shape, rank, args.steps))
            progress("lora", rows[-1])
    report("lora", args, rows)


if __name__ == "__main__":
    main()
