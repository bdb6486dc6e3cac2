"""Weight push trainer -> sampler: ``pipeline.weight_sync.WeightSync.push`` through the real
actors (a ``TrainerGroup`` FSDP2 rank and a ``SamplerPool`` worker with its engine), per
transport. Push time = gather on the trainer + transfer + copy into the engine, what
``timing/weight_sync`` reports in the loop. On one GPU both pools share it (resources/one_gpu).

After the timed pushes the sampler's weights are compared with the trainer's (a few tensors,
exactly, in the export dtype), so a fast push that delivered nothing would show.

    python -m bench.weight_sync --preset tiny --transports object_store,broadcast      # CPU
    python -m bench.weight_sync --preset qwen0.5b --transports cuda_ipc,object_store   # one GPU
"""
from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.common import parser, progress, report, target
from bench.sampler import PRESETS

CONF = Path(__file__).resolve().parents[1] / "conf"


def load_group_yaml(name: str) -> Any:
    """conf/<name>.yaml with its Hydra ``defaults`` list applied (same-group files, then _self_),
    e.g. resources/one_gpu = resources/default + its own keys."""
    from omegaconf import OmegaConf

    node = OmegaConf.load(CONF / f"{name}.yaml")
    defaults = list(node.pop("defaults", []))
    folder = name.rsplit("/", 1)[0]
    parts = []
    for d in defaults or ["_self_"]:
        parts.append(node if d == "_self_" else load_group_yaml(f"{folder}/{d}"))
    if "_self_" not in defaults:
        parts.append(node)
    return OmegaConf.merge(*parts)


def group(schema: type, name: str, **overrides: Any) -> Any:
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(OmegaConf.structured(schema), load_group_yaml(name))
    for k, v in overrides.items():
        OmegaConf.update(cfg, k, v, merge=False)
    return OmegaConf.to_object(cfg)


def sampler_probe(worker: Any, names: list[str]) -> dict[str, float]:
    """Runs inside the sampler actor: sums of a few parameters as the engine holds them."""
    params = dict(worker.engine.model.named_parameters())
    return {n: float(params[n].float().sum()) for n in names if n in params}


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--transports", default="object_store")
    p.add_argument("--pushes", type=int, default=5)
    p.add_argument("--bucket-mb", type=float, default=None)
    args = p.parse_args()

    import ray
    import torch

    from pipeline.models.config import ModelConfig
    from pipeline.pools import ResourcesConfig, create_pools, init_ray
    from pipeline.rollout_config import load_rollout_config
    from pipeline.sampler import SamplerPool
    from pipeline.trainer import TrainerConfig, TrainerGroup
    from pipeline.weight_sync import WeightSync

    on_gpu = torch.cuda.is_available()
    res = group(ResourcesConfig, "resources/one_gpu" if on_gpu else "resources/default")
    init_ray(res, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    pools = create_pools(res)
    model_over = dict(kv.split("=", 1) for kv in PRESETS[args.preset])
    model_over = {k: (int(v) if v.isdigit() else v == "true" if v in ("true", "false") else v)
                  for k, v in model_over.items()}
    model_cfg = group(ModelConfig, "model/tiny", dtype="bfloat16" if on_gpu else "float32", **model_over)
    # the trainer starts from other weights, so every push really changes the sampler
    trainer_model = group(ModelConfig, "model/tiny", dtype="float32", **{**model_over, "tiny.seed": 1})
    rollout = load_rollout_config("hf", ["n_trajectories=1", "turns=1", "max_response_length=8",
                                         "response_length_schedule=[]"])
    tcfg_over = {"weight_bucket_mb": args.bucket_mb} if args.bucket_mb else {}
    shared = pools.plan.colocated
    samplers = SamplerPool(model_cfg, rollout, {"_target_": "rewards.toy.ToyEnv"}, pool=pools.sampler,
                           gpu_memory_fraction=res.sampler.gpu_memory_fraction if shared else None)
    trainer = TrainerGroup(pools.trainer, trainer_model, group(TrainerConfig, "trainer/fsdp2", **tcfg_over),
                           None, max_response_length=8, temperature=1.0, total_optim_steps=1,
                           gpu_memory_fraction=res.trainer.gpu_memory_fraction if shared else None)
    rows = []
    try:
        sd = trainer.full_state_dict()
        export = torch.bfloat16 if on_gpu else torch.float32
        # bytes that travel: every transport sends a tied weight once, which only the trainer's
        # own state dict shows (the gathered copy above holds it twice, in separate storage)
        nbytes = trainer.run_all("ipc_payload_bytes")[0]
        probe_names = [n for n in list(sd)[:: max(1, len(sd) // 4)]]
        expected = {n: float(sd[n].to(export).float().sum()) for n in probe_names}
        del sd
        for transport in args.transports.split(","):
            sync = WeightSync(trainer, samplers, transport, timeout_s=300)
            times = [asyncio.run(sync.push(v)) for v in range(1, args.pushes + 2)][1:]  # first one warms up
            got = ray.get(samplers.workers[0].__ray_call__.remote(sampler_probe, probe_names))
            ok = all(abs(got.get(n, float("nan")) - e) <= 1e-3 * max(1.0, abs(e)) for n, e in expected.items())
            med = statistics.median(times)
            rows.append({"transport": transport, "push_ms_median": med * 1e3, "push_ms_min": min(times) * 1e3,
                         "push_ms_max": max(times) * 1e3, "MB": nbytes / 1e6, "GB/s": nbytes / med / 1e9,
                         "weights_match": ok})
            progress("weight_sync", rows[-1])
    finally:
        samplers.shutdown()
        trainer.shutdown()
        pools.remove()
        ray.shutdown()
    gpu_rows = [r for r in rows if r["transport"] in ("cuda_ipc", "broadcast")] if on_gpu else []
    extra = {"preset": args.preset, "payload_MB": nbytes / 1e6, "export_dtype": str(export),
             "colocated": shared,
             "target_gpu_path_le_100ms": target(min(r["push_ms_median"] for r in gpu_rows) <= 100)
             if gpu_rows else "n/a"}
    report("weight_sync", args, rows, extra)
    if not all(r["weights_match"] for r in rows):
        print("[weight_sync] the sampler's weights do not match the trainer's after a push", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
