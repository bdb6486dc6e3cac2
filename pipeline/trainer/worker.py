"""One FSDP2 data-parallel rank (run as a Ray actor by :class:`~pipeline.trainer.group.TrainerGroup`).

Holds an HF causal LM sharded with ``torch.distributed.fsdp.fully_shard`` (per decoder layer,
then the root), AdamW and a constant-after-warm-up LR schedule. ``train_step`` receives this
rank's rows and the driver's :class:`~pipeline.trainer.plan.RankPlan`; it recomputes the old
log-probs (unless ``off_policy_correction=bypass``), then runs one optimiser step per mini-batch
with gradient accumulation over the planned micro-batches. With ``trainer.lora.rank > 0`` only
peft's adapters train, and the weights that leave the rank are merged (pipeline/trainer/lora.py).

The forward (padded or packed rows, the log-prob head, the attention and fused kernels set up
before sharding) is pipeline/trainer/forward.py.
"""
from __future__ import annotations

import math
import os
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from pipeline.trainer.plan import RankPlan, micro_weight

if TYPE_CHECKING:
    from pipeline.algorithms.config import AlgorithmConfig
    from pipeline.models.config import ModelConfig
    from pipeline.trainer.config import TrainerConfig

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
BATCH_KEYS = ("input_ids", "attention_mask", "position_ids", "response_mask", "advantages",
              "sampler_log_probs")


def _dtype(name: str, on_gpu: bool) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if on_gpu else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"trainer dtype {name!r}: expected auto or one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class TrainerWorker:
    def __init__(self, rank: int, world_size: int, model_cfg: ModelConfig, trainer_cfg: TrainerConfig,
                 algo_cfg: AlgorithmConfig, max_response_length: int, temperature: float,
                 total_optim_steps: int, gpu_memory_fraction: float | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.model_cfg, self.cfg, self.algo = model_cfg, trainer_cfg, algo_cfg
        self.max_response_length = max_response_length
        self.temperature = temperature
        self.total_optim_steps = max(1, total_optim_steps)
        self.on_gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", 0) if self.on_gpu else torch.device("cpu")
        if self.on_gpu and gpu_memory_fraction:  # a GPU shared with the engine and kernel evaluations
            from pipeline.trainer.gpu_share import hold

            hold(gpu_memory_fraction, self.device)
        self.optim_steps = 0
        from pipeline.trainer.forward import flag

        self.packed = flag("remove_padding", trainer_cfg.remove_padding, self.on_gpu)

    # ---- setup -------------------------------------------------------------------------
    def address(self) -> tuple[str, int]:
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def init(self, master_addr: str, master_port: int, resume_dir: str | None = None) -> dict:
        backend = self.cfg.backend
        if backend == "auto":
            backend = "nccl" if self.on_gpu else "gloo"
        if self.on_gpu:
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend, init_method=f"tcp://{master_addr}:{master_port}", rank=self.rank,
            world_size=self.world_size, timeout=timedelta(seconds=self.cfg.init_timeout_s))
        torch.manual_seed(self.cfg.seed)
        # verl's loss and log-prob helpers import in seconds: pay it now, not inside step 0
        import verl.trainer.ppo.core_algos  # noqa: F401
        import verl.utils.torch_functional  # noqa: F401

        self._build_model(resume_dir)
        self._build_optimizer()
        if resume_dir:
            self._load_optimizer(resume_dir)
        return {"backend": backend, "device": str(self.device),
                "params": sum(p.numel() for p in self.model.parameters()),
                "trainable_params": sum(p.numel() for p in self.model.parameters() if p.requires_grad),
                "remove_padding": self.packed, "liger": self.liger,
                "compile_head": bool(self.cfg.compile_head and self.cfg.logprob_chunk_tokens > 0),
                "attn_implementation": self.model.config._attn_implementation,
                # for perf/mfu/actor: the peak FLOP/s of this GPU model (pipeline.metrics.peak_flops)
                "device_name": torch.cuda.get_device_name(self.device) if self.on_gpu else None}

    def _build_model(self, resume_dir: str | None) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from pipeline.models.load import with_path
        from pipeline.trainer import lora

        model_cfg = self.model_cfg
        if resume_dir and not lora.enabled(self.cfg):  # the checkpoint's HF weights replace the base model's
            model_cfg = with_path(model_cfg, os.path.join(resume_dir, "model"))
        # With several ranks, only rank 0 reads the checkpoint; the others build the skeleton on
        # the meta device and receive the weights by broadcast after sharding (one host copy of
        # a 32B model per node instead of one per rank). The tiny model is cheaper to rebuild.
        meta_init = self.world_size > 1 and model_cfg.path != "tiny" and self.rank != 0
        model, self.tokenizer = _load(model_cfg, meta=meta_init)
        if lora.enabled(self.cfg):  # the frozen base of model.path and the adapters (the checkpoint's)
            model = lora.apply(model, self.cfg.lora, None if meta_init else resume_dir)
        self.lora_scales = lora.scales(model)  # {} without LoRA: what an export merges
        full = model.state_dict() if self.world_size > 1 and model_cfg.path != "tiny" else None
        from pipeline.trainer.forward import (apply_liger, attention_implementation, checkpoint_share,
                                              decoder_layers, install_log_prob_head)

        attn = attention_implementation(self.cfg.attn_implementation, self.packed, self.on_gpu)
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(attn)
        else:
            model.config._attn_implementation = attn
        self.liger = bool(self.cfg.liger) and apply_liger(model)
        if self.cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            checkpoint_share(model, self.cfg.gradient_checkpointing_share)
        model.config.use_cache = False
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=_dtype(self.cfg.param_dtype, self.on_gpu),
                                      reduce_dtype=_dtype(self.cfg.reduce_dtype, self.on_gpu))
        for layer in decoder_layers(model):
            if self.cfg.compile_layers:
                layer.compile()  # in place: the module FSDP2 wraps next keeps its name and state dict
            fully_shard(layer, mesh=mesh, mp_policy=policy,
                        reshard_after_forward=self.cfg.reshard_after_forward)
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=self.cfg.reshard_after_forward)
        if full is not None or meta_init:
            model = model.to_empty(device=self.device) if meta_init else model.to(self.device)
            set_model_state_dict(model, {} if meta_init else full, options=StateDictOptions(
                full_state_dict=True, broadcast_from_rank0=True))
            # non-persistent buffers (rotary frequencies) are in no state dict: rank 0's are right
            for _, buf in sorted(model.named_buffers(), key=lambda x: x[0]):
                dist.broadcast(buf, src=0)
            del full
        model.to(self.device)
        model.train()
        if self.cfg.logprob_chunk_tokens > 0:
            install_log_prob_head(model, self.cfg.logprob_chunk_tokens, compiled=self.cfg.compile_head)
        self.model = model

    def _build_optimizer(self) -> None:
        from transformers import get_constant_schedule_with_warmup

        o = self.cfg.optim
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapters only
        self.optimizer = torch.optim.AdamW(trainable, lr=o.lr, betas=tuple(o.betas),
                                           eps=o.eps, weight_decay=o.weight_decay)
        warmup = max(1, math.ceil(o.warmup_ratio * self.total_optim_steps)) if o.warmup_ratio > 0 else 0
        self.scheduler = get_constant_schedule_with_warmup(self.optimizer, num_warmup_steps=warmup)

    def _log_probs(self, mb: dict[str, torch.Tensor], with_entropy: bool):
        from pipeline.trainer.forward import log_probs

        return log_probs(self.model, mb, self.device, self.temperature, self.cfg.logprob_chunk_tokens > 0,
                         self.packed, with_entropy)

    # ---- one training step -------------------------------------------------------------
    def train_step(self, shard: dict[str, torch.Tensor], plan: RankPlan, global_seqs: list[int],
                   global_tokens: list[int], loss_scale_factor: int | None = None) -> dict[str, float]:
        """``loss_scale_factor``: Dr. GRPO's constant (the step's max response length)."""
        from pipeline.algorithms import policy_loss, tis_weights
        from pipeline.staleness import MismatchStats

        t0 = time.perf_counter()
        filler = torch.tensor(plan.filler, dtype=torch.bool)
        shard = dict(shard)
        shard["response_mask"] = shard["response_mask"] * (~filler).unsqueeze(1).to(shard["response_mask"].dtype)
        mode = self.algo.off_policy_correction
        R = shard["response_mask"].shape[1]
        # old log-probs of the current weights, before any update of this step. The first
        # mini-batch trains on exactly those weights, so its own forward's log-probs, detached,
        # are its old ones (as TRL does with one optimiser step per batch): its old pass would
        # be an eighth of the step's compute spent on a copy.
        if mode == "bypass":
            old = shard["sampler_log_probs"].float()
        else:
            old = torch.zeros(shard["input_ids"].shape[0], R)
            with torch.no_grad():
                for mini in plan.mini_batches[1:]:
                    for pos in mini:
                        idx = torch.tensor(pos)
                        mb, logp, _ = self._log_probs({k: shard[k][idx] for k in BATCH_KEYS}, False)
                        old[idx, :logp.shape[1]] = logp.float().cpu()
        sums: dict[str, float] = {}
        mismatch = MismatchStats()  # sampler vs trainer log-probs of the same tokens (pipeline/staleness.py)
        grad_norms: list[float] = []
        tokens = 0
        for m, mini in enumerate(plan.mini_batches):
            for pos in mini:
                idx = torch.tensor(pos)
                mb, logp, ent = self._log_probs({k: shard[k][idx] for k in BATCH_KEYS}, True)
                r = logp.shape[1]
                mask = mb["response_mask"].to(self.device).float()
                seqs, toks = int((mask.sum(1) > 0).sum()), int(mask.sum())
                tokens += int(mb["attention_mask"].sum())
                if seqs == 0:  # filler: keep the collectives in step, contribute nothing
                    (logp.sum() * 0.0).backward()
                    continue
                on_policy = m == 0 and mode != "bypass"
                old_mb = logp.detach().float() if on_policy else old[idx, :r].to(self.device)
                if m == 0 or mode != "bypass":  # the trainer's pre-update log-probs are at hand
                    mismatch.add(old_mb if m else logp.detach(),
                                 mb["sampler_log_probs"][:, :r].to(self.device), mask)
                is_w = None
                if mode == "tis":
                    is_w = tis_weights(old_mb, mb["sampler_log_probs"][:, :r].to(self.device).float(),
                                       self.algo.tis_cap, mask)
                loss, metrics = policy_loss(old_mb, logp, mb["advantages"].to(self.device).float(),
                                            mask, self.algo, loss_scale_factor or self.max_response_length,
                                            rollout_is_weights=is_w, entropy=ent)
                w = micro_weight(self.algo.loss_agg_mode, seqs, toks, global_seqs[m], global_tokens[m])
                # FSDP averages gradients over ranks: scale by world size to get the sum
                (loss * (w * self.world_size)).backward()
                for k, v in {"actor/loss": loss.detach(), **metrics}.items():
                    v = float(v.detach()) if torch.is_tensor(v) else float(v)
                    sums[k] = sums.get(k, 0.0) + v * w / len(plan.mini_batches)
            grad_norms.append(self.optimizer_step())
        # the per-rank weighted shares add up to the global means
        keys = sorted(sums)
        vec = torch.tensor([sums[k] for k in keys] + mismatch.as_vector() + [float(tokens)],
                           dtype=torch.float64)
        gap_max = torch.tensor([mismatch.abs_max], dtype=torch.float64)
        if self.world_size > 1:
            dev_vec, dev_max = vec.to(self.device), gap_max.to(self.device)
            dist.all_reduce(dev_vec)
            dist.all_reduce(dev_max, op=dist.ReduceOp.MAX)
            vec, gap_max = dev_vec.cpu(), dev_max.cpu()
        out = {k: float(vec[i]) for i, k in enumerate(keys)}
        out.update(MismatchStats.metrics(vec[len(keys):-1].tolist(), float(gap_max[0])))
        out["actor/grad_norm"] = sum(grad_norms) / len(grad_norms)
        out["actor/grad_norm_max"] = max(grad_norms)
        out["actor/lr"] = float(self.scheduler.get_last_lr()[0])
        out["actor/optim_steps"] = float(self.optim_steps)
        out["actor/tokens"] = float(vec[-1])
        out["actor/rank_time_s"] = time.perf_counter() - t0
        if self.on_gpu:  # verl's memory metrics (the group keeps the largest rank's)
            out["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            out["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(self.device) / 2**30
        return out

    def optimizer_step(self) -> float:
        """Clip, step (skipped on a non-finite gradient norm), zero, schedule; the norm."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.algo.grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        if math.isfinite(float(grad_norm)):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.optim_steps += 1
        return float(grad_norm)

    def sft_step(self, shard: dict[str, torch.Tensor], plan: RankPlan, global_seqs: list[int],
                 global_tokens: list[int]) -> dict[str, float]:
        """One supervised step per mini-batch (pipeline/trainer/sft.py)."""
        from pipeline.trainer.sft import sft_step

        return sft_step(self, shard, plan, global_tokens)

    # ---- weights out -------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """All ranks must call (a collective); rank 0 gets the full HF-named state dict on CPU."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return sd if self.rank == 0 else None

    def exported_state_dict(self) -> dict[str, torch.Tensor] | None:
        """What a weight push sends (all ranks call; rank 0 gets it): the full state dict with a
        tied weight under its first name only, since the engines tie it again themselves; with
        LoRA, merged under the base names."""
        from pipeline.trainer.lora import merged
        from pipeline.weight_push import gathered_without_aliases

        sd = self.full_state_dict()
        if sd is None:
            return None
        sd = gathered_without_aliases(self.model, sd)
        return dict(merged(sd, self.lora_scales)) if self.lora_scales else sd

    def export_dtype(self) -> torch.dtype:
        return _dtype(self.cfg.export_dtype, self.on_gpu)

    def buckets(self, sd: dict[str, torch.Tensor]) -> list[list[tuple[str, torch.Tensor]]]:
        """Named tensors in buckets of about ``weight_bucket_mb``, in the export dtype."""
        limit = self.cfg.weight_bucket_mb * 2**20
        dtype = self.export_dtype()
        out: list[list[tuple[str, torch.Tensor]]] = [[]]
        size = 0
        for name, t in sd.items():
            t = t.to(dtype) if t.is_floating_point() else t
            nbytes = t.numel() * t.element_size()
            if out[-1] and size + nbytes > limit:
                out.append([])
                size = 0
            out[-1].append((name, t))
            size += nbytes
        return out

    # ---- weight push: a sender per transport (pipeline/weight_push/), reached through the registry --
    def weight_sender(self, transport: str) -> Any:
        """This rank's sender of ``transport`` (made at first use; it keeps its state between
        pushes: the object store's refs, cuda_ipc's buffers, broadcast's group)."""
        from pipeline.weight_push import REGISTRY

        senders = self.__dict__.setdefault("_senders", {})
        if transport not in senders:
            if transport not in REGISTRY:
                raise ValueError(f"weight transport {transport!r}: expected one of {tuple(REGISTRY)}")
            senders[transport] = REGISTRY[transport].sender(self)
        return senders[transport]

    def weight_sender_call(self, transport: str, method: str, *args: Any) -> Any:
        """The actor entry of every transport: ``method(*args)`` of this rank's sender."""
        return getattr(self.weight_sender(transport), method)(*args)

    def weight_payload_bytes(self) -> int:
        """Bytes one push carries (a tied weight once, floats in the export dtype): the same for
        every transport."""
        from pipeline.trainer.lora import export_shapes
        from pipeline.weight_push import without_aliases

        itemsize = self.export_dtype().itemsize
        sd = export_shapes(without_aliases(self.model.state_dict()))
        return sum(t.numel() * (itemsize if t.is_floating_point() else t.element_size()) for t in sd.values())

    # ---- checkpoints -------------------------------------------------------------------
    def save(self, directory: str) -> None:
        """Model in HF format (save_pretrained; with LoRA the merged policy, and the adapter in
        peft's format beside it) + optimizer/scheduler; rank 0 writes."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        from pipeline.trainer import lora

        sd = self.full_state_dict()
        osd = get_optimizer_state_dict(self.model, self.optimizer,
                                       options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0 and self.lora_scales:
            lora.save_adapter(sd, self.cfg.lora, os.path.join(directory, lora.ADAPTER_DIR))
            sd = dict(lora.merged(sd, self.lora_scales))
        if self.rank == 0:
            self.model.save_pretrained(os.path.join(directory, "model"), state_dict=sd,
                                       safe_serialization=True)
            self.tokenizer.save_pretrained(os.path.join(directory, "model"))
            torch.save({"optimizer": osd, "scheduler": self.scheduler.state_dict(),
                        "optim_steps": self.optim_steps}, os.path.join(directory, "optimizer.pt"))
        if self.world_size > 1:
            dist.barrier()

    def _load_optimizer(self, directory: str) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        state = torch.load(os.path.join(directory, "optimizer.pt"), weights_only=False, map_location="cpu")
        if "optimizer" in state:
            set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=state["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
        elif self.rank == 0:  # a carried checkpoint (bench/ckpt_carry.py): the moments stayed behind
            print(f"[trainer] {directory}/optimizer.pt holds the schedule only (step {state['optim_steps']}): "
                  "the optimiser's moments start from zero", file=sys.stderr, flush=True)
        self.scheduler.load_state_dict(state["scheduler"])
        self.optim_steps = state["optim_steps"]

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _load(model_cfg: ModelConfig, meta: bool) -> tuple[torch.nn.Module, Any]:
    """The policy in fp32 (master weights; the compute dtype comes from the FSDP policy), or,
    with ``meta``, its skeleton on the meta device from the checkpoint's config.json alone."""
    from pipeline.models.load import load_model_and_tokenizer, load_tokenizer

    if not meta:
        model, tokenizer = load_model_and_tokenizer(model_cfg)
        return model.to(torch.float32), tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    trust = bool(model_cfg.trust_remote_code)
    from pipeline.hub import is_hub_id

    path = os.path.expanduser(str(model_cfg.path))
    config = AutoConfig.from_pretrained(path, local_files_only=not is_hub_id(path), trust_remote_code=trust)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust, dtype=torch.float32)
    return model, load_tokenizer(model_cfg)
