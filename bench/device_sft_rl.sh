#!/usr/bin/env bash
# Warm start, then RL, on one H200: a 0.5B Qwen2-shaped model warm-started on the cuda answer corpus, then
# kernel_multiturn with the cuda backend and vLLM, in one device call (< 9 min). Without the vLLM
# bundle: ROLLOUT=hf STEPS=8 LIMIT=560 (first run, H100, 2026-12-05, LIMIT=430: SFT 44 s, corpus
# answers 118 s, Ray and the trainer 61 s, then 55-100 s a step: two RL steps):
#
#   bash .devpkgs/install.sh && bash bench/device_sft_rl.sh [extra Hydra overrides]
#
# WARM_ONLY=1 builds the warm start and its prebuild alone (python -m pipeline.warm_start), e.g. in
# the background of an earlier call of the same warm machine.
#
# The laptop recipe (docs/sft.md) at the 0.5B body: profile=laptop keeps its sizes (one task,
# L1/19_silu; 16 trajectories x 1 turn; the warm start's wrong and broken answers x3, trained until
# loss 0.007) while the model is the body of Qwen2.5-0.5B (hidden 896, 24 layers, 14/2 heads,
# intermediate 4864, random-initialised) with the tiny tokenizer learnt from the cuda corpus
# (vocabulary 2048: no model hub here), in bf16 on the GPU, and the reward is the real cuda
# backend at the tasks' full sizes. The SFT runs on the GPU (resources=one_gpu passed to it) at
# SFT_LR; RL at RL_LR (the tiny model's 1e-4 broke the copied answers at 3e-4; a 24-layer body is
# given less: at 2e-5 the first batch's two Adam steps moved its tokens' log-probs by a KL of
# 0.057 (the laptop's tiny model at its 1e-4: 0.005) and from the next batch on 94-100 % of the
# answers were syntax errors, H200 2026-12-05; 5e-6 aims at the laptop's step size, reached over
# the first 10 % of the optimiser steps, as Adam's first steps move every weight by the full lr). Needs the vLLM 0.24 bundle at /tmp/vsite (../shared/tools/DEVICE-VLLM.md) and
# .devpkgs at /tmp/site. The SFT step logs to the console (logger=console): .devpkgs' wandb lacks
# platformdirs, and the warm start's own logger.mode=disabled still imports wandb (its first H200
# try, 2026-12-04, stopped there). Writes under $OUT: sft_rl.log, metrics.jsonl, episodes (sample) and the
# timeline of the RL run.
set -u
out=${OUT:-/tmp/bench_out}
mkdir -p "$out"
. bench/device_env.sh
SFT_LR=${SFT_LR:-3e-4} RL_LR=${RL_LR:-5e-6} RL_WARMUP=${RL_WARMUP:-0.1} STEPS=${STEPS:-8} LIMIT=${LIMIT:-520} ROLLOUT=${ROLLOUT:-vllm}
# 16 cores: the warm start's corpus answers and each step's new ones build 8 at a time (the
# default 2 x 4 jobs took 118 s for the 4 corpus answers on the H100, 2026-12-05)
COMPILE_WORKERS=${COMPILE_WORKERS:-8}
# vLLM: the model's positions (8192) bound the engine's length (vllm.yaml's 32768 is for
# Qwen2.5-sized runs); the engine and the trainer take 0.25 and 0.30 of the GPU, and the kernel
# evaluations the rest less a margin (sandbox.gpu_memory_share 0.42, set by pipeline.main)
engine_args=()
if [ "$ROLLOUT" = vllm ]; then
  engine_args=(rollout.engine.vllm.max_model_len=8192 resources.sampler.gpu_memory_fraction=0.25
               resources.trainer.gpu_memory_fraction=0.3)
fi
run=/tmp/sft_rl_run
args=(+experiment=kernel_multiturn profile=laptop
  resources=one_gpu rollout=$ROLLOUT reward.backend=cuda reward.profile=full model.dtype=bfloat16
  model.tiny.hidden_size=896 model.tiny.intermediate_size=4864 model.tiny.num_hidden_layers=24
  model.tiny.num_attention_heads=14 model.tiny.num_key_value_heads=2 model.tiny.max_position_embeddings=8192
  "model.warm_start_overrides=[\"resources=one_gpu\",\"trainer.optim.lr=$SFT_LR\",\"logger=console\"]"
  model.warm_start_dir=/tmp/warm_start sandbox.cache_dir=/tmp/sft_rl_build_cache
  sandbox.compile_workers=$COMPILE_WORKERS sandbox.max_jobs=2
  trainer.optim.lr=$RL_LR trainer.optim.warmup_ratio=$RL_WARMUP pipeline.steps=$STEPS pipeline.heartbeat_s=30
  logger=console name=sft_rl "${engine_args[@]}" "$@")
if [ "${WARM_ONLY:-0}" = 1 ]; then
  # the warm start and its prebuild alone (an earlier call of the same machine, while the vLLM
  # bundle still travels); the run then finds both cached
  timeout -k 15 "$LIMIT" python3 -m pipeline.warm_start "${args[@]}" hydra.run.dir=/tmp/warm_start_cli \
    >"$out/warm_start.log" 2>&1
  rc=$?
  echo "warm_start rc=$rc"; grep -E "^\[pipeline\]|^\[sft\]|Error" "$out/warm_start.log" | cut -c1-300 | tail -n 8
  exit $rc
fi
rm -rf "$run"
# the curve so far reaches $OUT every 15 s (bench/device_env.sh run_copying)
run_copying "$run" "$out" "$out/sft_rl.log" "$LIMIT" python3 -m pipeline.main "${args[@]}" hydra.run.dir=$run
rc=$?
echo "sft_rl rc=$rc"
grep -E "Error|error:|Traceback" "$out/sft_rl.log" | cut -c1-300 | tail -n 12
grep -E "^\[sft\]|^\[pipeline\]|^\[step " "$out/sft_rl.log" | cut -c1-400 | tail -n 40
ls /tmp/warm_start/*/run 2>/dev/null | head
exit $rc
