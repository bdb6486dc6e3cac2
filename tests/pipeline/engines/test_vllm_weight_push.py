"""A weight push into vLLM by the fast transport (needs vLLM and a GPU; skipped elsewhere).

A ``SamplerWorker`` with the vLLM engine (CUDA graphs on) serves a 0.5B-shaped random Qwen2
built by the project's model code; an FSDP2 trainer rank in another process (as a Ray actor
would be) holds other weights and pushes them by cuda_ipc. After each push the engine's tensors
equal what the trainer sent (per-tensor checksums, stacked tensors included), every parameter
kept its storage (so the captured graphs read the new weights), greedy generation changed, and
the push's transport and engine-load times are recorded (``$OUT/vllm_weight_push.json`` when
``OUT`` is set).
"""
import asyncio
import json
import multiprocessing as mp
import os
import time

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.gpu]

# bench.sampler's qwen0.5b preset: Qwen2.5-0.5B's shape, tied embeddings
from bench.sampler import PRESETS  # noqa: E402

VLLM = ["engine.vllm.gpu_memory_utilization=0.3", "engine.vllm.max_model_len=1024",
        "engine.vllm.max_num_seqs=32", "engine.vllm.enforce_eager=false", "engine.vllm.dtype=bfloat16",
        "engine.vllm.enable_sleep_mode=false", "n_trajectories=1", "turns=1", "max_response_length=16",
        "response_length_schedule=[]"]


def _trainer(q_in, q_out):
    """A one-rank FSDP2 trainer on the same GPU: answers ("send", version) with a cuda_ipc
    payload (and its own seconds) and ("step",) with an in-place change of every parameter."""
    import torch

    from pipeline.conf_files import load_group
    from pipeline.models.load import load_model_config
    from pipeline.trainer import TrainerConfig, TrainerWorker
    from pipeline.trainer.worker import free_port

    model_cfg = load_model_config("tiny", PRESETS["qwen0.5b"] + ["tiny.seed=1"])
    worker = TrainerWorker(0, 1, model_cfg, load_group(TrainerConfig, "trainer", "fsdp2"), None,
                           max_response_length=16, temperature=1.0, total_optim_steps=1,
                           gpu_memory_fraction=0.3)
    worker.init("127.0.0.1", free_port())
    q_out.put("ready")
    while (cmd := q_in.get()) is not None:
        if cmd[0] == "send":
            t0 = time.perf_counter()
            payload = worker.weight_sender_call("cuda_ipc", "send", cmd[1], True)
            q_out.put((payload, time.perf_counter() - t0))
        elif cmd[0] == "step":
            with torch.no_grad():
                for p in worker.model.parameters():
                    p.to_local().mul_(0.5)
            q_out.put("stepped")
    worker.shutdown()


async def test_cuda_ipc_push_into_vllm_keeps_storage_and_changes_generation():
    from pipeline.models.load import load_model_config
    from pipeline.rollout_config import load_rollout_config
    from pipeline.sampler_worker import SamplerWorker

    worker = SamplerWorker(load_model_config("tiny", PRESETS["qwen0.5b"] + ["dtype=bfloat16"]),
                           load_rollout_config("vllm", VLLM), {"_target_": "rewards.toy.ToyEnv", "n_tasks": 1})
    engine = worker.engine
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    trainer = ctx.Process(target=_trainer, args=(q_in, q_out))
    trainer.start()
    from pipeline.engines import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    prompts = [worker.tokenizer(f"<|im_start|>user\nkernel {i}", add_special_tokens=False)["input_ids"]
               for i in range(8)]

    async def generate():
        return [g.token_ids for g in await asyncio.gather(*[engine.generate(p, greedy) for p in prompts])]

    def pointers():
        return engine._call(lambda: engine.llm.apply_model(
            lambda m: {n: p.data_ptr() for n, p in m.named_parameters()})[0])

    pushes = []
    try:
        assert q_out.get(timeout=300) == "ready"
        before, ptrs = await generate(), pointers()
        for version in (1, 2, 3):
            if version > 1:
                q_in.put(("step",))
                assert q_out.get(timeout=120) == "stepped"
            t0 = time.perf_counter()
            q_in.put(("send", version))
            payload, send_s = q_out.get(timeout=120)
            report = await worker.receive_weights(payload, version)
            total = time.perf_counter() - t0
            pushes.append({"version": version, "total_s": total, "trainer_send_s": send_s,
                           "trainer_pack_s": payload.timings["pack_s"],
                           "trainer_checksum_s": payload.timings["checksum_s"],
                           "transport_s": total - report["load_s"] - report.get("check_s", 0.0)
                           - payload.timings["checksum_s"],
                           **{k: report[k] for k in ("receive_s", "load_s", "check_s", "checked", "tensors")}})
            print("push", pushes[-1])
            assert report["problems"] == [] and report["unchecked"] == [], report
            # every HF tensor sent was compared (q/k/v and gate/up inside vLLM's stacked ones)
            assert report["tensors"] == len(payload.checksums) > 200 and report["checked"] > 100
            assert engine.version == version
        after = await generate()
        assert pointers() == ptrs  # loaded in place: CUDA graphs captured at start stay valid
        assert after != before
        # the mapping was opened once: the same buffers served every push
        assert worker.receiver.state("cuda_ipc").mapped.buffer_id == payload.buffer_id
    finally:
        q_in.put(None)
        trainer.join(120)
        await worker.aclose()
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "vllm_weight_push.json"), "w") as f:
            json.dump({"preset": "qwen0.5b", "pushes": pushes}, f, indent=1)
    steady = pushes[1:]
    print(f"cuda_ipc into vLLM, after the first push: transport "
          f"{[round(p['transport_s'] * 1e3, 1) for p in steady]} ms, load "
          f"{[round(p['load_s'] * 1e3, 1) for p in steady]} ms")
