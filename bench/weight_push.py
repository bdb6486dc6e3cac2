"""Weight push trainer -> sampler: ``pipeline.weight_push`` push objects through the real actors
(a ``TrainerGroup`` FSDP2 rank and a ``SamplerGroup`` worker with its engine, HF or vLLM), per
transport. Push time = gather on the trainer + transfer + copy into the engine, what
``timing_s/update_weights`` reports in the loop; each push is split into transport (everything but
the engine's copy and the checksums), engine load, and checks. On one GPU both pools share it
(resources/one_gpu). Bar: cuda_ipc transport of 0.5B bf16 at most 20 ms.

Every push is verified: the sender checksums what it sends, every engine compares its tensors
(exact integer sums of the bits), so a fast push that delivered nothing would fail. Besides,
after the timed pushes a few tensors are compared by value.

    python -m bench.weight_push --preset tiny --transports object_store,broadcast      # CPU
    python -m bench.weight_push --preset qwen0.5b --transports cuda_ipc,object_store   # one GPU
    python -m bench.weight_push --preset qwen0.5b --transports cuda_ipc --engine vllm  # vLLM
"""
from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.common import parser, progress, report, target
from bench.sampler import PRESETS

from pipeline.conf_files import CONF_DIR as CONF  # noqa: E402


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
    """Runs inside the sampler actor: sums of a few parameters as the engine holds them (HF
    names; a vLLM engine's stacked tensors are not among the names probed)."""
    engine = worker.engine
    if hasattr(engine, "llm"):
        return engine._call(lambda: engine.llm.apply_model(lambda m: {
            n: float(p.float().sum()) for n, p in m.named_parameters() if n in names})[0])
    params = dict(engine.model.named_parameters())
    return {n: float(params[n].float().sum()) for n in names if n in params}


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--transports", default="object_store")
    p.add_argument("--pushes", type=int, default=5)
    p.add_argument("--bucket-mb", type=float, default=None)
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    p.add_argument("--no-verify", action="store_true", help="skip the checksums after each push")
    args = p.parse_args()

    import ray
    import torch

    from pipeline.models.config import ModelConfig
    from pipeline.resources import create_resource_pools, init_ray
    from pipeline.resources_config import ResourcesConfig
    from pipeline.rollout_config import load_rollout_config
    from pipeline.sampler import SamplerGroup
    from pipeline.trainer import TrainerConfig, TrainerGroup
    from pipeline.weight_push import make_weight_push

    on_gpu = torch.cuda.is_available()
    res = group(ResourcesConfig, "resources/one_gpu" if on_gpu else "resources/default")
    init_ray(res, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    pools = create_resource_pools(res)
    model_over = dict(kv.split("=", 1) for kv in PRESETS[args.preset])
    model_over = {k: (int(v) if v.isdigit() else v == "true" if v in ("true", "false") else v)
                  for k, v in model_over.items()}
    model_cfg = group(ModelConfig, "model/tiny", dtype="bfloat16" if on_gpu else "float32", **model_over)
    # the trainer starts from other weights, so every push really changes the sampler
    trainer_model = group(ModelConfig, "model/tiny", dtype="float32", **{**model_over, "tiny.seed": 1})
    over = ["n_trajectories=1", "turns=1", "max_response_length=8", "response_length_schedule=[]"]
    if args.engine == "vllm":
        over += ["engine.vllm.max_model_len=2048", "engine.vllm.enable_sleep_mode=false",
                 "engine.vllm.max_num_seqs=64"]
    rollout = load_rollout_config(args.engine, over)
    tcfg_over = {"weight_bucket_mb": args.bucket_mb} if args.bucket_mb else {}
    shared = pools.plan.colocated
    samplers = SamplerGroup(model_cfg, rollout, {"_target_": "rewards.toy.ToyEnv"},
                            resource_pool=pools.sampler,
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
        nbytes = trainer.weight_payload_bytes()
        probe_names = [n for n in list(sd)[:: max(1, len(sd) // 4)] if "_proj" not in n or "o_proj" in n
                       or "down_proj" in n]
        expected = {n: float(sd[n].to(export).float().sum()) for n in probe_names}
        del sd
        for transport in args.transports.split(","):
            sync = make_weight_push(trainer, samplers, transport, timeout_s=300, verify=not args.no_verify)
            times, parts = [], []
            for v in range(1, args.pushes + 2):
                times.append(asyncio.run(sync.push(v)))
                parts.append(dict(sync.last_stats))
            times, parts = times[1:], parts[1:]  # the first one maps, allocates, warms up
            got = ray.get(samplers.workers[0].__ray_call__.remote(sampler_probe, probe_names))
            ok = all(abs(got.get(n, float("nan")) - e) <= 1e-3 * max(1.0, abs(e)) for n, e in expected.items())
            ok = ok and (args.no_verify or min(p["checked_tensors"] for p in parts) > 0)
            med = statistics.median(times)

            def median_ms(key: str) -> float:
                return statistics.median(p.get(key, 0.0) for p in parts) * 1e3

            transport_ms = median_ms("transport_s")
            rows.append({"transport": transport, "engine": args.engine, "push_ms_median": med * 1e3,
                         "push_ms_min": min(times) * 1e3, "push_ms_max": max(times) * 1e3,
                         "transport_ms_median": transport_ms,
                         "transport_ms_max": max(p["transport_s"] for p in parts) * 1e3,
                         "load_ms_median": median_ms("load_s"), "check_ms_median": median_ms("check_s"),
                         "sender_pack_ms_median": median_ms("sender_pack_s"),
                         "checked_tensors": min(p["checked_tensors"] for p in parts),
                         "MB": nbytes / 1e6, "transport_GB/s": nbytes / (transport_ms / 1e3) / 1e9
                         if transport_ms else None, "weights_match": ok, "pushes": parts})
            progress("weight_push", {k: v for k, v in rows[-1].items() if k != "pushes"})
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
    ipc = [r for r in rows if r["transport"] == "cuda_ipc"]
    if ipc and on_gpu:
        extra["target_cuda_ipc_transport_le_20ms"] = target(ipc[0]["transport_ms_median"] <= 20)
    report("weight_push", args, rows, extra)
    if not all(r["weights_match"] for r in rows):
        print("[weight_push] the sampler's weights do not match the trainer's after a push", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
