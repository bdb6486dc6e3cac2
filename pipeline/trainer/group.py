"""Driver-side handle on the trainer ranks: one :class:`TrainerWorker` actor per bundle of the
trainer's resource pool, joined into one torch.distributed group through rank 0's address.
``train`` takes a ``TrainBatch`` (built by pipeline.algorithms.build_train_batch), plans its split
over ranks, mini- and micro-batches (pipeline/trainer/plan.py) and runs the step on all ranks at
once; ``weight_sender_call`` makes every rank's sender of a transport take part in a push."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from pipeline.trainer.plan import StepPlan, plan_step
from pipeline.trainer.worker import BATCH_KEYS, TrainerWorker

if TYPE_CHECKING:
    from pipeline.algorithms.config import AlgorithmConfig
    from pipeline.models.config import ModelConfig
    from pipeline.resources import ResourcePool
    from pipeline.trainer.config import TrainerConfig


class TrainerOutOfMemory(RuntimeError):
    """A trainer rank ran out of GPU memory; the message names the settings that size a step."""


def out_of_memory(exc: BaseException, method: str, algo: AlgorithmConfig, trainer_cfg: TrainerConfig,
                  world_size: int) -> TrainerOutOfMemory | None:
    """``exc`` (a rank's error, as Ray hands it over) reworded for the person who set the run up,
    when it is CUDA running out of memory; None for any other error. A step's memory is set by
    the tokens of one forward/backward, activation checkpointing, the log-prob head's chunking
    and how many GPUs share the parameters and optimiser state (FSDP2)."""
    cause = getattr(exc, "cause", None) or exc  # Ray's error subclasses its cause's class, with its own text
    if not isinstance(cause, torch.OutOfMemoryError):
        return None
    said = (str(cause).strip().splitlines() or [""])[0][:240]
    chunk = int(trainer_cfg.logprob_chunk_tokens)
    ways = [f"lower algorithm.micro_batch_tokens (now {algo.micro_batch_tokens}; on one 80 GB H100 a "
            f"0.5B model's RL step fit 32768, a 1.5B one's did not)"]
    if not trainer_cfg.gradient_checkpointing:
        ways.append("set trainer.gradient_checkpointing=true (recomputes activations in backward)")
    if chunk <= 0:
        ways.append("set trainer.logprob_chunk_tokens=1024 (no full [tokens, vocabulary] logits)")
    ways.append(f"give the trainer more GPUs (resources; {world_size} now), which FSDP2 shards the "
                f"parameters and optimiser state over")
    return TrainerOutOfMemory(f"the trainer ran out of GPU memory in {method} "
                              f"({algo.micro_batch_tokens} tokens a forward/backward on each of "
                              f"{world_size} rank(s)): " + "; or ".join(ways) + f". CUDA said: {said}")


class TrainerGroup:
    def __init__(self, pool: ResourcePool, model_cfg: ModelConfig, trainer_cfg: TrainerConfig,
                 algo_cfg: AlgorithmConfig, max_response_length: int, temperature: float, total_optim_steps: int,
                 gpu_memory_fraction: float | None = None, resume_dir: str | None = None,
                 env_vars: dict[str, str] | None = None) -> None:
        self.algo, self.trainer_cfg = algo_cfg, trainer_cfg
        self.max_response_length = max_response_length
        self.world_size = len(pool)
        self._pool, self._env_vars = pool, env_vars
        self._args = (model_cfg, trainer_cfg, algo_cfg, max_response_length, temperature,
                      total_optim_steps, gpu_memory_fraction)
        self.restarts = 0
        self.workers: list[Any] = []
        self._spawn(resume_dir)

    def _spawn(self, resume_dir: str | None) -> None:
        """One actor per bundle, rendezvous through rank 0, the model (and optimizer state) from
        ``resume_dir`` when given."""
        import ray

        actor_cls = ray.remote(TrainerWorker)
        self.workers = []
        for rank in range(self.world_size):
            opts = self._pool.actor_options(rank)
            if self._env_vars:
                opts["runtime_env"] = {"env_vars": self._env_vars}
            self.workers.append(actor_cls.options(**opts).remote(rank, self.world_size, *self._args))
        addr, port = ray.get(self.workers[0].address.remote())
        self.info = ray.get([w.init.remote(addr, port, resume_dir) for w in self.workers])[0]

    def restart(self, resume_dir: str | None) -> None:
        """A rank was lost: every rank goes (the survivors' process group counts the lost one) and a
        new group starts in the same bundles from ``resume_dir`` (a checkpoint; None: the initial
        weights). Blocking; an actor lost while the new group starts raises its actor error."""
        import ray

        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:
                pass  # already gone
        self.restarts += 1
        self._spawn(resume_dir)

    def actor_ids(self) -> set[str]:
        """The ranks' Ray actor ids (hex), to tell a lost rank's error from another actor's."""
        return {w._actor_id.hex() for w in self.workers}

    def lost(self, timeout_s: float = 30.0) -> bool:
        """Whether a rank is gone: its ping fails with an actor error (a live rank answers, or is
        still inside a call and is not counted)."""
        import ray
        from ray.exceptions import RayActorError

        refs = [w.address.remote() for w in self.workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError:
                return True
        return False

    def _call(self, method: str, *args: Any) -> list[Any]:
        import ray

        return ray.get([getattr(w, method).remote(*args) for w in self.workers])

    def train(self, batch: Any, loss_scale_factor: int | None = None) -> dict[str, float]:
        """One RL step on a ``TrainBatch``: ``ppo_mini_batches`` optimiser steps."""
        return self._step("train_step", batch, loss_scale_factor)

    def train_sft(self, batch: Any) -> dict[str, float]:
        """One supervised step on a ``TrainBatch`` whose response mask marks the assistant
        tokens (pipeline/trainer/sft.py): ``ppo_mini_batches`` optimiser steps."""
        return self._step("sft_step", batch)

    def _step(self, method: str, batch: Any, *extra: Any) -> dict[str, float]:
        import ray

        t0 = time.perf_counter()
        lengths = batch.attention_mask.sum(1).tolist()
        loss_tokens = batch.response_mask.sum(1).tolist()
        plan: StepPlan = plan_step([int(x) for x in lengths], [int(x) for x in loss_tokens],
                                   self.world_size, self.algo.ppo_mini_batches,
                                   self.algo.micro_batch_tokens,
                                   groups=(list(batch.group_ids) if method == "train_step"
                                           and self.algo.mini_batch_by_group else None))
        refs = []
        for w, rp in zip(self.workers, plan.ranks):
            idx = torch.tensor(rp.rows, dtype=torch.long)
            shard = {k: getattr(batch, k)[idx] for k in BATCH_KEYS}
            refs.append(getattr(w, method).remote(shard, rp, plan.global_seqs, plan.global_tokens,
                                                  *extra))
        try:
            per_rank = ray.get(refs)
        except Exception as exc:  # noqa: BLE001 - only an out-of-memory is reworded
            oom = out_of_memory(exc, method, self.algo, self.trainer_cfg, self.world_size)
            if oom is None:
                raise
            raise oom from exc
        out = dict(per_rank[0])
        for key in ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"):
            if key in out:
                out[key] = max(r[key] for r in per_rank)
        wall = time.perf_counter() - t0
        out["perf/train_tokens_per_s"] = out["actor/tokens"] / wall if wall > 0 else 0.0
        out["actor/samples"] = float(len(lengths))
        out["actor/mini_batches"] = float(len(plan.global_seqs))
        out["actor/micro_batches"] = float(sum(len(m) for m in plan.ranks[0].mini_batches))
        return out

    # ---- weight push (pipeline/weight_push/): every rank's sender takes part in a push --------
    def weight_sender_call(self, transport: str, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` of every rank's sender of ``transport``, started: one Ray ref per
        rank, rank 0's first (await them together, or ``ray.get``; only rank 0 answers with data)."""
        return [w.weight_sender_call.remote(transport, method, *args) for w in self.workers]

    def rank0_address(self) -> tuple[str, int]:
        import ray

        return ray.get(self.workers[0].address.remote())

    def weight_payload_bytes(self) -> int:
        return self._call("weight_payload_bytes")[0]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self._call("full_state_dict")[0]

    def save(self, directory: str) -> None:
        self._call("save", directory)

    def shutdown(self) -> None:
        import ray

        try:
            self._call("shutdown")
        except Exception:
            pass
        for w in self.workers:
            ray.kill(w)
