#!/usr/bin/env bash
# The H200 runs behind docs/performance.md, one part per device call (each part < 10 min):
#   bash bench/device.sh compile   # bench.cuda_isolation, sandbox selfcheck (cuda), bench.sandbox
#   bash bench/device.sh build     # bench.cuda_build (plain torch vs narrow header)
#   bash bench/device.sh gpu       # bench.trainer (padded + the RL step), bench.weight_push
#   bash bench/device.sh mfu       # bench.trainer with flex_attention, the bench loop with compiled layers
#   bash bench/device.sh recheck   # bench.cuda_isolation, bench.pipeline at 8 steps (one GPU)
#   bash bench/device.sh stream    # bench.reward_streaming (cuda), bench.sampler (hf)
#   bash bench/device.sh vllm      # vLLM (after .vbundle is installed): its tests, the cuda_ipc push
#                                  # into vLLM, bench.sampler vllm vs bare vLLM, then hf (< 8 min)
#   bash bench/device.sh evals     # bench.sandbox, bench.reward_streaming (smaller)
#   bash bench/device.sh sync      # the GPU weight-sync test, bench.weight_push (cuda_ipc), the RL step at 32k
#   bash bench/device.sh sampler   # bench.sampler (hf) with the engine's generate time per path
#   bash bench/device.sh scale     # the compiled RL step at 0.5B and 1.5B, bench.sampler (hf) with 6 repeats
#   bash bench/device.sh levers    # the trainer's GPU tests, the packed RL step at 0.5B/1.5B, compile on/off
#   bash bench/device.sh levers-liger  # the same with Liger's kernels (carry .ligerpkgs too: bench/device_liger_pkgs.sh)
#   bash bench/device.sh levers-scale  # 3B packed (with and without activation checkpointing), 1.5B ckpt, 1.5B padded at 32k
#   bash bench/device.sh levers-head   # the compiled log-prob head (+chead) beside packed+compile, 0.5B and 1.5B,
#                                      # with each row's profiler table (where the step's GPU time goes)
# Needs .devpkgs installed into /tmp/site (bash .devpkgs/install.sh), built on the CPU machine with
#   EXTRA="verl==0.9.1 codetiming tensordict==0.10.0 pyvers torchdata==0.11.0 pylatexenc dill orjson" \
#     bash ../shared/tools/device-pkgs.sh
# (orjson: verl.utils.tracking imports it; the 2026-12-02 run lacked it and the trainer could not start). Every bench has its own time
# limit, so one that hangs costs only its share; results are re-packed into $OUT after each.
set -u
part=${1:?usage: bench/device.sh compile|build|gpu|mfu|stream|recheck|vllm|evals|sync|scale|sampler|levers|levers-liger|levers-scale|levers-head}
out=${OUT:-/tmp/bench_out}
res=/tmp/bench_res/$part
mkdir -p "$res" "$out"
. bench/device_env.sh
py=python3

step() {  # step NAME LIMIT_S CMD...: run with a limit, log, keep the result files
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s): $*"
  timeout -k 10 "$limit" "$@" >"$res/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc in $((SECONDS - t0))s"
  tail -n 25 "$res/$name.log"
  tar -czf "$out/$part.tar.gz" -C /tmp/bench_res "$part"
}

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv >"$res/gpu.txt" 2>&1
nproc >>"$res/gpu.txt"; cat "$res/gpu.txt"
# everything the benches import, so a missing package shows here and not as a bench's crash
$py -c "import ray, hydra, omegaconf, verl.trainer.ppo.core_algos, verl.utils.experimental.torch_functional, \
pipeline.main, sandbox.pool, rewards.env; print('imports ok', ray.__version__)" 2>&1 | tail -3

case $part in
compile)
  step cuda_isolation 60 $py -m bench.cuda_isolation --out "$res/cuda_isolation.json"
  # The probe can drop every namespace and Landlock, never the rlimits or the scrubbed environment:
  # if CUDA fails under those alone, no sandboxed GPU run can work; save the device time.
  if $py -c "import json,sys; r={x['row']: x['cuda_ok'] for x in json.load(open('$res/cuda_isolation.json'))['rows']}; sys.exit(0 if r.get('rlimits') else 1)"; then
    step selfcheck 200 $py -m sandbox.selfcheck --backend cuda --out "$res/selfcheck" \
         --set compile_workers=8 --set max_jobs=2 --set max_concurrent=16
    step sandbox 260 $py -m bench.sandbox --backend cuda --prime 2 --distinct 16 --max-concurrent 16 \
         --compile-workers 8 --max-jobs 2 --out "$res/sandbox_cuda.json"
  else
    echo "=== CUDA fails under the rlimits/environment alone: selfcheck and bench.sandbox skipped"
  fi
  ;;
build)  # 2026-12-03: a plain torch build took 60.6 s here (--modes torch); 120 s did not reach the narrow rows
  step cuda_build 400 $py -m bench.cuda_build --modes torch,narrow --jobs 4 --out "$res/cuda_build_h200.json"
  ;;
gpu)
  step trainer 300 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $py -m bench.trainer --preset qwen0.5b \
       --rows 64 --min-len 256 --max-len 4096 --token-budget 8192 --steps 2 --layouts padded --rl-step \
       --rl-budgets 8192,32768 --rl-chunks 1024 --prompt-len 512 --out "$res/trainer_h200.json"
  step weight_push 150 $py -m bench.weight_push --preset qwen0.5b --transports cuda_ipc,object_store \
       --pushes 4 --out "$res/weight_push_h200.json"
  ;;
mfu)  # the levers the 2026-12-03 profile points at, each against the padded sdpa row of `gpu`
  # packed rows through flex_attention's block mask instead of sdpa's dense one (compiles first)
  step trainer_flex 200 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $py -m bench.trainer --preset qwen0.5b \
       --rows 64 --min-len 256 --max-len 4096 --token-budget 8192 --steps 2 --attn flex_attention \
       --layouts packed --out "$res/trainer_flex_h200.json"
  # every decoder layer under torch.compile (fuses the eager elementwise work); the project's RL
  # step with trainer.compile_layers is in the `scale` part (measured 2026-12-03)
  step trainer_compile 250 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $py -m bench.trainer --preset qwen0.5b \
       --rows 64 --min-len 256 --max-len 4096 --token-budget 8192 --steps 2 --compile --layouts padded,packed \
       --out "$res/trainer_compile_h200.json"
  ;;
stream)
  step reward_streaming 180 $py -m bench.reward_streaming --backend cuda --compiled 12 --cheap 12 \
       --gen-seconds 20 --max-concurrent 16 --compile-workers 8 --out "$res/reward_streaming_cuda.json"
  step sampler_hf 120 $py -m bench.sampler --engine hf --preset qwen0.5b --dtype bfloat16 --tasks 4 \
       --trajectories 8 --max-tokens 128 --repeats 2 --out "$res/sampler_hf_h200.json"
  ;;
recheck)  # the 2026-12-03 follow-up: Landlock variants (+ strace where present), the pipeline at 8 steps
  step cuda_isolation 90 $py -m bench.cuda_isolation --out "$res/cuda_isolation.json"
  if command -v strace >/dev/null; then
    d=$(mktemp -d)
    step strace 40 strace -f -e trace=%file,%desc -o "$res/strace.txt" $py -m bench.cuda_isolation --child landlock "$d"
    grep -E 'EACCES|EPERM|EROFS' "$res/strace.txt" | head -20
  else
    echo "no strace on this machine"
  fi
  step pipeline 250 $py -m bench.pipeline --steps 8 --run-root /tmp/bench_runs --out "$res/pipeline_h200_8steps.json" -- \
       +experiment=toy resources=one_gpu model.dtype=bfloat16 model.tiny.vocab_size=151936 \
       model.tiny.hidden_size=896 model.tiny.intermediate_size=4864 model.tiny.num_hidden_layers=24 \
       model.tiny.num_attention_heads=14 model.tiny.num_key_value_heads=2 model.tiny.tie_word_embeddings=true \
       rollout.n_trajectories=8 rollout.max_response_length=256 pipeline.tasks_per_batch=4
  ;;
vllm)  # the engine's tests and the push into it (JSON of each push's times in $res),
  # the persistent cuda_ipc buffers across processes, the push through the real actors into vLLM,
  # the sampler against bare vLLM on the same prompts, and HF beside it (smaller: ~0.6k tokens/s)
  # its own process: an in-process vLLM engine has taken torch.distributed's default group
  step gpu_sync_test 40 $py -m pytest -q -s -rA tests/pipeline/weight_push/test_gpu_weight_push.py
  step vllm_tests 150 env OUT="$res" $py -m pytest -q -s -rA -m "vllm or gpu" tests/pipeline/engines/test_vllm_engine.py \
       tests/pipeline/engines/test_vllm_weight_push.py
  step weight_push_vllm 80 $py -m bench.weight_push --preset qwen0.5b --engine vllm --transports cuda_ipc \
       --pushes 6 --out "$res/weight_push_vllm_h200.json"
  step sampler_vllm 90 $py -m bench.sampler --engine vllm --preset qwen0.5b --dtype bfloat16 --tasks 4 \
       --trajectories 16 --max-tokens 256 --repeats 2 --gpu-memory-utilization 0.3 --out "$res/sampler_vllm_h200.json"
  # (the HF fallback: part sampler; measured there at ~0.6k tokens/s)
  ;;
evals)  # 2026-12-03, after the device gate, the "min" header tier; sized for the ~330 s left that day
  step sandbox 140 $py -m bench.sandbox --backend cuda --prime 2 --distinct 8 --max-concurrent 16 \
       --compile-workers 8 --max-jobs 2 --out "$res/sandbox_cuda_gated.json"
  step reward_streaming 150 $py -m bench.reward_streaming --backend cuda --compiled 3 --cheap 6 \
       --gen-seconds 20 --max-concurrent 16 --compile-workers 8 --out "$res/reward_streaming_cuda.json"
  ;;
sync)  # 2026-12-03: flat-bucket cuda_ipc (its GPU test, then the bench), the project's RL step at 32k
  step gpu_tests 120 $py -m pytest -x -q tests/pipeline/weight_push/test_gpu_weight_push.py
  step weight_push 100 $py -m bench.weight_push --preset qwen0.5b --transports cuda_ipc --pushes 6 \
       --out "$res/weight_push_h200.json"
  step trainer_rl 240 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $py -m bench.trainer --preset qwen0.5b \
       --rows 64 --min-len 256 --max-len 4096 --steps 2 --layouts "" --rl-step --rl-budgets 32768 \
       --rl-chunks 1024 --prompt-len 512 --out "$res/trainer_rl_h200.json"
  ;;
scale)  # 2026-12-03: the RL step without the first mini-batch's old pass, compiled,
  # at 0.5B and 1.5B (wider matmuls); the sampler wrapper with enough repeats to see 5 %
  step trainer_rl_compile 120 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $py -m bench.trainer \
       --preset qwen0.5b --rows 64 --min-len 256 --max-len 4096 --steps 2 --layouts "" --compile --rl-step \
       --rl-budgets 32768 --rl-chunks 1024 --prompt-len 512 --out "$res/trainer_rl_compile_h200.json"
  step trainer_rl_1p5b 200 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $py -m bench.trainer \
       --preset qwen1.5b --rows 64 --min-len 256 --max-len 4096 --steps 2 --layouts "" --compile --rl-step \
       --rl-budgets 16384 --rl-chunks 1024 --prompt-len 512 --out "$res/trainer_rl_1p5b_h200.json"
  step sampler_hf 200 $py -m bench.sampler --engine hf --preset qwen0.5b --dtype bfloat16 --tasks 4 \
       --trajectories 8 --max-tokens 128 --repeats 6 --out "$res/sampler_hf_h200.json"
  ;;
sampler)  # bench.sampler (hf) alone, with the engine's own generate time per path
  step sampler_hf 200 $py -m bench.sampler --engine hf --preset qwen0.5b --dtype bfloat16 --tasks 4 \
       --trajectories 8 --max-tokens 128 --repeats 6 --out "$res/sampler_hf_h200.json"
  ;;
levers|levers-liger|levers-scale|levers-head)  # bench/trainer_rl.py's LEVER_SETS at 32k, one set per call
  # (rows are saved as they finish; --time-limit-s starts no row that the step's limit would cut)
  set_name=$part
  profile=()
  if [ "$part" = levers-head ]; then
    profile=(--rl-profile "$res/profile")
  fi
  if [ "$part" = levers ]; then
    step gpu_trainer_tests 100 $py -m pytest -x -q -m gpu tests/pipeline/trainer/test_gpu_trainer.py
  fi
  if [ "$part" = levers-liger ]; then
    bash .ligerpkgs/install.sh 2>&1 | tail -2
  fi
  step trainer_$set_name 340 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $py -m bench.trainer \
       --preset qwen0.5b --rows 64 --min-len 256 --max-len 4096 --steps 2 --layouts "" --rl-step \
       --rl-budgets 32768 --rl-chunks 1024 --prompt-len 512 --rl-configs $set_name --time-limit-s 230 \
       "${profile[@]}" --out "$res/trainer_$set_name.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
