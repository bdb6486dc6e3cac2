#!/usr/bin/env bash
# bench.pipeline on one H200 with the vLLM engine and the kernel env (cuda backend): sync (k = 0)
# and one_off (k = 1), one k per device call on the same warm machine (each takes 4-8 min: Ray,
# vLLM (~50 s cold, ~25 s with the compile cache) and the trainer start, and k = 0's first step
# builds the three answers, ~120 s):
#
#   bash .devpkgs/install.sh && KS=0 bash bench/pipeline_vllm.sh [extra Hydra overrides]
#   KS=1 bash bench/pipeline_vllm.sh                                   # the next call
#   python -m bench.pipeline --summarise k0/pipeline_vllm_kernel.json,k1/pipeline_vllm_kernel.json
#
# Needs the vLLM 0.24 bundle installed at /tmp/vsite (../shared/tools/DEVICE-VLLM.md) and
# .devpkgs at /tmp/site. Writes under $OUT: pipeline_vllm_kernel.json (rewritten after each k),
# pipeline_vllm_kernel.log, runs/timeline_k<k>.png (+ .jsonl), each run dir's metrics.jsonl and
# gpu_clocks_k<k>.csv (SM clock, power, use every 0.5 s; the timeline's wall times align with it).
#
# The model is a random-initialised Qwen2 of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14/2
# heads, vocabulary 151,936, tied embeddings; the tiny tokenizer). A random model's answers never
# parse, so the kernel env scores a stored correct answer (rewards/solutions/cuda) for SHARE of the
# evaluations (bench/stored_answers.py); the sandbox compiles (once per answer: one shared build
# cache), checks and times them on the GPU that vLLM and the trainer share (resources=one_gpu;
# sampler 0.30 of its memory, trainer 0.40, the evaluator's processes the rest: pipeline.main sets
# sandbox.gpu_memory_share to 0.27 from them. An earlier H200 run used 0.40 / 0.45 with the sandbox
# admitting up to 0.9 of the GPU, an overcommit its small footprints survived; 672 sequences' KV
# (~1.8 k prompt + 512 tokens, 12 KB a token, prompts shared in the prefix cache) fits 0.30, and
# the 0.5B trainer at 16 k tokens a micro-batch fits 0.40 (compiled at 32 k it peaked at 40.8 GiB)). At this
# vocabulary every response runs to the limit, so the overlong filter is off (or nothing would be
# trained).
#
# The workload is meant to put sync mode's generate+reward and train phases within 1.5x of each
# other (the bench prints both and their ratio, "sync phases:"). The first run (2 turns, 16
# trajectories, 512 tokens) was 7x unbalanced: the second turn's generation waited for the first
# turn's sandbox scores (32-42 s each on the shared GPU) while training took 6.4 s. The second (one
# turn, 3 tasks x 128 trajectories) dealt 3 new tasks of the 12 answered ones at every step, so every
# step's reward phase was three cold CUDA builds on a CPU shared with vLLM and the trainer (compile
# p50 33-46 s): generate+reward 3.7-4.5x train. So the default now scores the same 3 tasks at every
# step (--answer-tasks 3: builds hit the cache from the second step, as a run's repeated answers do;
# the reward phase is the evaluations' own work on the GPU). An earlier H200 run used 224 trajectories
# a task (672 sequences): balanced (1.45x), but vLLM's steps took 60-70 ms (~10 k tokens/s, half
# the rate at 384 sequences), likely because 672 is past vLLM's largest CUDA-graph batch (512 by
# its default), so every step ran without graphs (not verified). The engine now asks vLLM for
# graphs up to max_num_seqs (rollout.engine.vllm.max_cudagraph_capture_size), so the default is
# that workload again, 224 a task (672 sequences; ~340 k generated and ~1.6 M trained tokens a
# batch: the prompts are ~1.8 k tokens with the tiny tokenizer), about 6 sandboxed evaluations a
# batch (SHARE), 4 steps per k: the same batch with graphs says whether eager steps were the cause.
# `rollout.engine.vllm.max_cudagraph_capture_size=512` as an extra override repeats the eager case.
# The trainer stays uncompiled (the kernel experiments compile layers and head on GPU runs since
# 2026-12-05): the earlier H200 run balanced this workload with eager training, and a
# faster train phase would unbalance it; `trainer.compile_layers=true trainer.compile_head=true`
# as extra overrides measure the compiled trainer in the loop.
# TURNS, NTRAJ, RESP, SHARE, ANSWER_TASKS, STEPS move it. One k per device call fits the 10 min
# limit (KS=0, then KS=1 on the same warm machine: the build cache in /tmp carries over, so k = 1's
# steady steps hit it as k = 0's do); `python -m bench.pipeline --summarise k0.json,k1.json` then
# compares them as one run.
set -u
out=${OUT:-/tmp/bench_out}
mkdir -p "$out"
. bench/device_env.sh
KS=${KS:-0} STEPS=${STEPS:-4} SHARE=${SHARE:-0.009} BUDGET=${BUDGET:-0} LIMIT=${LIMIT:-560}
TURNS=${TURNS:-1} NTRAJ=${NTRAJ:-224} RESP=${RESP:-512} ANSWER_TASKS=${ANSWER_TASKS:-3}
SEQS=$((NTRAJ * 3))
# The trainer's peak at this workload was 33.7 GiB allocated, 36.7 GiB reserved (the earlier
# H200 run): 0.40 of an H200 (56 GiB) holds it, 0.40 of an 80 GB H100 (32 GiB) would not, so an H100
# gives the trainer 0.55 (44 GiB) and the evaluator's processes what is left (~0.15).
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
if [ "${gpu_mib:-0}" -lt 100000 ]; then TRAINER_FRAC=${TRAINER_FRAC:-0.55}; else TRAINER_FRAC=${TRAINER_FRAC:-0.4}; fi
SAMPLER_FRAC=${SAMPLER_FRAC:-0.3}
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv >"$out/gpu.txt" 2>&1
# the GPU's clocks, power and use twice a second for the whole run (gpu_clocks_k<k>.csv): whether
# a phase ran at lower clocks (an H200 with little to do clocks down; the judge already warms it
# before timing) is one question the earlier H200 run's sync-vs-one_off generation left open
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,power.draw,temperature.gpu \
  --format=csv,nounits -lms 500 >"$out/gpu_clocks_k$KS.csv" 2>/dev/null &
clocks=$!
# SIGTERM GRACE s before LIMIT: the loop finishes the step under way, checkpoints it (to /tmp, not
# $OUT: a 0.5B trainer's state is GBs) and stops (pipeline/loop.py), so the JSON holds every
# finished step; the kill comes at LIMIT. --foreground: the signal goes to bench.pipeline alone;
# without it timeout signals its whole process group, Ray's processes included, and the stopped
# loop then hung in the session's close (seen on the CPU box: no JSON after the stop)
GRACE=${GRACE:-75}
timeout --foreground -k "$GRACE" "$((LIMIT - GRACE))" python3 -m bench.pipeline --ks "$KS" --steps "$STEPS" --budget-s "$BUDGET" \
  --stored-answers --answer-share "$SHARE" --answer-tasks "$ANSWER_TASKS" --run-root "$out/runs" --out "$out/pipeline_vllm_kernel.json" -- \
  +experiment=kernel_multiturn resources=one_gpu rollout=vllm reward.backend=cuda reward.profile=cpu \
  model.dtype=bfloat16 model.tiny.vocab_size=151936 model.tiny.hidden_size=896 \
  model.tiny.intermediate_size=4864 model.tiny.num_hidden_layers=24 model.tiny.num_attention_heads=14 \
  model.tiny.num_key_value_heads=2 model.tiny.tie_word_embeddings=true model.tiny.max_position_embeddings=8192 \
  resources.sampler.gpu_memory_fraction=$SAMPLER_FRAC resources.trainer.gpu_memory_fraction=$TRAINER_FRAC \
  rollout.engine.vllm.max_model_len=8192 rollout.engine.vllm.max_num_seqs=$SEQS rollout.engine.max_inflight=$SEQS \
  pipeline.tasks_per_batch=3 rollout.n_trajectories=$NTRAJ \
  rollout.turns=$TURNS rollout.max_prompt_length=4096 rollout.max_response_length=$RESP \
  "rollout.response_length_schedule=[]" algorithm.drop_zero_adv_groups=false algorithm.overlong_filter=off \
  algorithm.micro_batch_tokens=16384 trainer.compile_layers=false trainer.compile_head=false \
  sandbox.cache_dir=/tmp/bench_pipeline_build_cache checkpoint.dir=/tmp/bench_pipeline_ckpt \
  sandbox.compile_workers=4 "$@" >"$out/pipeline_vllm_kernel.log" 2>&1
rc=$?
kill "$clocks" 2>/dev/null
echo "bench.pipeline rc=$rc"
grep -E "Error|error:|Traceback" "$out/pipeline_vllm_kernel.log" | cut -c1-300 | tail -n 12
grep -E "^\[bench.pipeline\]|^sync phases|^\[step " "$out/pipeline_vllm_kernel.log" | cut -c1-600 | tail -n 30
sed -n '/^## bench.pipeline/,$p' "$out/pipeline_vllm_kernel.log" | cut -c1-700
exit $rc
