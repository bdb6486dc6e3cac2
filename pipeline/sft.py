"""Supervised warm start: ``python -m pipeline.sft +experiment=kernel_sft [key=value ...]``.

Fine-tunes any HF causal LM (``model.path``, or the tiny Qwen2) on kernel conversations
(pipeline/sft_data.py: the turn-1 prompt the kernel environment builds -> an answer in the format
it parses), loss on the assistant tokens only, with the RL run's FSDP2 trainer
(``TrainerGroup.train_sft``: same ranks, optimiser, micro-batch plan and checkpoint writer), the
same logger (console, metrics.jsonl, W&B) and a progress bar. Writes ``<run dir>/final/model``, an
HF checkpoint that ``pipeline.main`` takes as ``model.path`` (``sft.output_dir`` moves it).
"""
from __future__ import annotations

import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from pipeline.conf_files import CONF_PATH

if TYPE_CHECKING:
    from pipeline.algorithms.config import AlgorithmConfig
    from pipeline.config import Config
    from pipeline.models.config import ModelConfig
    from pipeline.sft_config import SftConfig
    from pipeline.trainer.config import TrainerConfig
    from rewards.env import KernelEnv


def conversations(conf: Config, env: KernelEnv) -> list[Any]:
    from pipeline.sft_data import corpus_conversations, jsonl_conversations

    s = conf.sft
    if s.data == "corpus":
        from rewards.corpus import corpus_tasks

        ids = list(s.task_ids) or [t.task_id for t in env.tasks("train")
                                   if t.task_id in set(corpus_tasks(env.backend))]
        return corpus_conversations(env.backend, ids, list(s.variants) or None,
                                    dict(s.variant_weights))
    known = {t.task_id for split in ("train", "holdout") for t in env.tasks(split)}
    return jsonl_conversations(s.data, known)


def check(conf: Config) -> None:
    errors = []
    if conf.sft.epochs < 1:
        errors.append(f"sft.epochs={conf.sft.epochs}: expected >= 1")
    from rewards.corpus import VARIANTS

    for v, w in conf.sft.variant_weights.items():
        if v not in VARIANTS or w < 0:
            errors.append(f"sft.variant_weights.{v}={w}: expected a corpus variant "
                          f"({', '.join(VARIANTS)}) with a weight >= 0")
    if conf.sft.batch_size < 1:
        errors.append(f"sft.batch_size={conf.sft.batch_size}: expected >= 1")
    if conf.env != "kernel":
        errors.append(f"env={conf.env!r}: pipeline.sft trains on kernel conversations (env=kernel)")
    if errors:
        from pipeline.config import ConfigError

        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))


def run(cfg: DictConfig, run_dir: str | Path) -> Path:
    """Train; returns the HF model directory written."""
    import ray

    from pipeline.config import check as check_config
    from pipeline.config import check_required
    from pipeline.metrics import MetricsLogger
    from pipeline.models.load import load_tokenizer
    from pipeline.resources import create_resource_pools, init_ray
    from pipeline.sft_data import tokenize
    from pipeline.trainer import TrainerGroup
    from rewards.env import KernelEnv

    run_dir = Path(run_dir)
    conf = cast("Config", cfg)  # Hydra's typed DictConfig of Config (pipeline.config.preflight says why)
    check_required(conf)
    OmegaConf.resolve(cfg)
    resolved = OmegaConf.to_container(cfg)
    check_config(conf)
    check(conf)
    s = conf.sft
    env = KernelEnv(conf.reward, eval_pool=None)  # prompts and task sources only: nothing is run
    tokenizer = load_tokenizer(conf.model)
    convs = conversations(conf, env)
    rows = tokenize(convs, env, tokenizer, conf.rollout.max_prompt_length, s.max_response_length)
    steps_per_epoch = -(-len(rows) // s.batch_size)
    total = steps_per_epoch * s.epochs
    print(f"[sft] {len(rows)} conversations ({convs[0].label.split(':')[0]}), {s.epochs} epochs x "
          f"{steps_per_epoch} steps of {s.batch_size}; answers {min(len(r) for _, r in rows)}-"
          f"{max(len(r) for _, r in rows)} tokens", file=sys.stderr, flush=True)
    env_vars = {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    r = conf.resources.trainer
    local = (r.gpus if r.gpus > 0 else r.cpu_ranks) == 1 and conf.resources.ray.address is None
    started, pools, trainer, logger = False, None, None, None
    try:
        # temperature 1: the loss is the NLL of the model's own distribution
        args = (conf.model, conf.trainer, conf.algorithm, s.max_response_length, 1.0)
        steps = total * conf.algorithm.ppo_mini_batches
        if local:  # one rank: the same worker in this process (no Ray start-up, no niced actor)
            trainer = LocalTrainer(*args, total_optim_steps=steps)
        else:
            started = init_ray(conf.resources, runtime_env={"env_vars": env_vars})
            pools = create_resource_pools(conf.resources)
            trainer = TrainerGroup(pools.trainer, *args, total_optim_steps=steps, env_vars=env_vars)
        logger = MetricsLogger(conf.logger, run_dir, run_name=f"{conf.name}", resolved_config=resolved)
        model_dir = train(trainer, logger, rows, tokenizer.pad_token_id, s, total,
                          conf.pipeline.progress and sys.stderr.isatty(),
                          Path(s.output_dir).expanduser() if s.output_dir else run_dir / "final")
    finally:
        for closer in (logger and logger.close, trainer and trainer.shutdown, pools and pools.remove):
            if closer:
                closer()
        if started:
            ray.shutdown()
    return model_dir


class LocalTrainer:
    """``TrainerGroup``'s SFT surface over one :class:`TrainerWorker` in this process (world size
    1 on gloo or NCCL): the same worker code, plan and checkpoint writer."""

    def __init__(self, model_cfg: ModelConfig, trainer_cfg: TrainerConfig, algo_cfg: AlgorithmConfig,
                 max_response_length: int, temperature: float, total_optim_steps: int) -> None:
        from pipeline.trainer import TrainerWorker
        from pipeline.trainer.worker import free_port

        self.algo = algo_cfg
        self.worker = TrainerWorker(0, 1, model_cfg, trainer_cfg, algo_cfg, max_response_length,
                                    temperature, total_optim_steps)
        self.worker.init("127.0.0.1", free_port())

    def train_sft(self, batch: Any) -> dict[str, float]:
        import torch

        from pipeline.trainer import plan_step
        from pipeline.trainer.worker import BATCH_KEYS

        plan = plan_step([int(x) for x in batch.attention_mask.sum(1)],
                         [int(x) for x in batch.response_mask.sum(1)], 1,
                         self.algo.ppo_mini_batches, self.algo.micro_batch_tokens)
        rows = torch.tensor(plan.ranks[0].rows, dtype=torch.long)
        shard = {k: getattr(batch, k)[rows] for k in BATCH_KEYS}
        return self.worker.sft_step(shard, plan.ranks[0], plan.global_seqs, plan.global_tokens)

    def save(self, directory: str) -> None:
        self.worker.save(directory)

    def shutdown(self) -> None:
        self.worker.shutdown()


def train(trainer: Any, logger: Any, rows: list[Any], pad_token_id: int, s: SftConfig, total: int,
          progress: bool, out: Path) -> Path:
    from tqdm import tqdm

    from pipeline.sft_data import sft_batch

    rng = random.Random(s.seed)
    bar = tqdm(total=total, desc="sft", file=sys.stderr, dynamic_ncols=True, disable=not progress)
    step = 0
    first = last = None
    t0 = time.time()
    for epoch in range(s.epochs):
        if last is not None and last <= s.stop_loss:
            print(f"[sft] loss {last:.4f} <= sft.stop_loss={s.stop_loss}: stopping after epoch {epoch}",
                  file=sys.stderr, flush=True)
            break
        order = list(range(len(rows)))
        rng.shuffle(order)
        for i in range(0, len(order), s.batch_size):
            batch = sft_batch([rows[j] for j in order[i:i + s.batch_size]], pad_token_id)
            t = time.time()
            m = trainer.train_sft(batch)
            m.update({"sft/epoch": float(epoch), "timing_s/step": time.time() - t})
            logger.log(step, m)
            first = m["sft/loss"] if first is None else first
            last = m["sft/loss"]
            bar.update(1)
            bar.set_postfix(loss=f"{last:.3f}")
            step += 1
    bar.close()
    # written beside, then renamed: a cache reader never sees half a checkpoint
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainer.save(str(tmp))
    os.remove(tmp / "optimizer.pt")  # a warm start carries weights only; RL builds its own optimiser
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"[sft] {step} steps in {time.time() - t0:.0f} s: loss {first:.3f} -> {last:.3f}; "
          f"model.path={out / 'model'}", file=sys.stderr, flush=True)
    return out / "model"


@hydra.main(config_path=CONF_PATH, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from pipeline.config import ConfigError
    from pipeline.sft_data import DataError

    try:
        run(cfg, HydraConfig.get().runtime.output_dir)
    except (ConfigError, DataError) as e:
        print(f"[sft] {e}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    from pipeline.config import register

    register()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
