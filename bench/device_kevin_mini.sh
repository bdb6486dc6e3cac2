#!/usr/bin/env bash
# Kevin in miniature on one GPU, in one device call: a real pretrained code model (joined by
# bench/device_model.sh to /tmp/models/NAME), the generated kernel corpus (KernelBench's held-out
# tasks and shapes left out), an SFT warm start on it, then multi-turn GRPO+ with vLLM and one_off
# pipelining on KernelBench level-1 train tasks (cuda backend, full sizes), until the call's limit.
#
#   bash bench/device_kevin_mini.sh [NAME=qwen2.5-coder-1.5b-instruct] [extra pipeline.main overrides]
#
# Env: LIMIT (s, whole script, default 570), LORA (adapter rank for RL, default 16; 0: full
# fine-tuning), RL_LR (2e-5 with LoRA), SFT=0 skips the warm start (RL from the base model),
# SFT_EPOCHS (2), SFT_LR (1e-5), RL=0 stops after the warm start (a call that joins the model can
# also train the SFT, leaving the next call's whole limit to RL), CKPT_EVERY (3 steps; one checkpoint kept), KILL_GRACE (60 s between
# the RL run's SIGTERM, which ends its step and checkpoints, and SIGKILL), TASKS (comma-separated
# train task ids of KernelBench's split of levels 1-2 at holdout_frac 0.2, seed 0; default below). Needs .devpkgs, the vLLM
# bundle at /tmp/vsite and .kb/KernelBench. Writes under $OUT: corpus.log, sft.log, rl.log,
# metrics.jsonl (copied every 15 s, so a call cut at its limit still returns its steps),
# timeline.png, and with LoRA the newest checkpoint as ckpt.tar.NN (bench/ckpt_carry.py): copied
# here into .carry/ and carried, the next machine's call resumes it. Run again on the same warm machine, it skips the SFT and the RL run resumes
# from its latest checkpoint (resume=auto, same run dir and command).
set -u
name=${1:-qwen2.5-coder-1.5b-instruct}
[ $# -gt 0 ] && shift
out=${OUT:-/tmp/kevin_out}
mkdir -p "$out"
t_start=$SECONDS
LIMIT=${LIMIT:-570}
if [ -d .devpkgs ]; then bash .devpkgs/install.sh >/dev/null 2>&1 || echo "devpkgs install failed"; fi
. bench/device_env.sh
model=/tmp/models/$name
[ -f "$model/config.json" ] || { echo "no $model: run bench/device_model.sh join $name first"; exit 2; }
# KernelBench level-1 train tasks of the corpus's kind (elementwise: what the SFT taught), at
# KernelBench's earlier 4096 x 16384 (SIZES; their files' 4096 x 393216 take ~51 GiB an evaluation,
# more than an H100 has beside the engine and the trainer). From matmuls, LayerNorm and GELU the SFT
# model wrote no correct kernel in 128 answers: every group scored 0, nothing to learn (2026-12-07).
ew="L1/19_ReLU L1/20_LeakyReLU L1/21_Sigmoid L1/25_Swish L1/26_GELU_ L1/27_SELU_ L1/28_HardSigmoid L1/29_Softplus L1/31_ELU"
TASKS=${TASKS:-$(echo $ew L1/88_MinGPTNewGelu | tr ' ' ',')}
SIZES=${SIZES:-$(for t in $ew; do printf "'%s:dim=16384'," "$t"; done | sed 's/,$//')}
work=/tmp/kevin
mkdir -p "$work"
left() { echo $((LIMIT - (SECONDS - t_start))); }

python3 -m rewards.corpus.generate --out "$work/corpus" --backend cuda --tasks .kb/KernelBench >"$work/corpus.log" 2>&1
tail -n 2 "$work/corpus.log"
start=$model
# While the SFT trains (the GPU's work), the sandbox builds its precompiled headers for the corpus's
# compile flags into the RL run's build cache (a cold header build is ~56 s, and the RL run's first
# batch would wait on it): one corpus answer evaluated with pch_min_builds=1, then the pool waits
# for the header builds it asked for (closing it at once would cancel them), in the background.
warm=
if [ -z "$(ls -A "$work/build_cache/pch" 2>/dev/null)" ]; then
  ( t0=$SECONDS; timeout 300 python3 - "$work/corpus" "$work/build_cache" >"$out/warm_headers.log" 2>&1 <<'PY'
import asyncio, json, pathlib, re, sys, time
from sandbox.config import load_default_config
from sandbox.pool import SandboxPool
corpus, cache = pathlib.Path(sys.argv[1]), sys.argv[2]
row = json.loads((corpus / "sft.jsonl").read_text().splitlines()[0])
level, name = row["task"].split("/", 1)
task = (corpus / f"level{level[1:]}" / f"{name}.py").read_text()
answer = re.search(r"```python\n(.*?)```", row["response"], re.S).group(1)
async def warm() -> None:
    async with SandboxPool(load_default_config(backend="cuda", cache_dir=cache, pch_min_builds=1)) as pool:
        r = await pool.evaluate(task, answer, "cuda")
        print(f"{row['task']}: correct={r.correct} error_kind={r.error_kind}", flush=True)
        t = time.monotonic()
        await pool.headers_ready()
        print(f"headers ready {time.monotonic() - t:.0f} s after the answer", flush=True)
asyncio.run(warm())
PY
    echo "header warm-up rc=$? in $((SECONDS - t0)) s: $(ls "$work/build_cache/pch" 2>/dev/null | wc -l) header sets" >>"$out/warm_headers.log" ) &
  warm=$!
fi
if [ "${SFT:-1}" = 1 ]; then
  t0=$SECONDS
  if [ ! -f "$work/sft/model/config.json" ]; then
    timeout -k 10 $(( $(left) - 240 )) python3 -m pipeline.sft +experiment=kernel_sft model=local \
      model.path="$model" resources=one_gpu reward=kernel_cuda reward.tasks="$work/corpus" reward.holdout_frac=0 \
      sft.data="$work/corpus/sft.jsonl" sft.epochs=${SFT_EPOCHS:-2} trainer.optim.lr=${SFT_LR:-1e-5} \
      sft.output_dir="$work/sft" trainer.gradient_checkpointing=true algorithm.micro_batch_tokens=8192 logger=console hydra.run.dir="$work/sft_run" >"$out/sft.log" 2>&1
    echo "sft rc=$? in $((SECONDS - t0)) s"
    grep -E "^\[sft\]|Error|error:" "$out/sft.log" | cut -c1-300 | tail -n 12
  fi
  [ -f "$work/sft/model/config.json" ] && start=$work/sft/model
fi
[ -n "$warm" ] && { wait "$warm"; tail -n 3 "$out/warm_headers.log"; }
[ "${RL:-1}" = 0 ] && { echo "RL=0: stopping after the warm start ($start)"; exit 0; }
echo "RL from $start, $(left) s left"
run=$work/rl
# a checkpoint carried from an earlier machine (.carry/ckpt.tar.NN, written by the pack below)
if [ -f .carry/ckpt.tar.01 ] && [ ! -d "$run/checkpoints" ]; then python3 -m bench.ckpt_carry unpack .carry "$run"; fi
# LoRA (LORA=0: full fine-tuning): its checkpoint travels back in $OUT (bench/ckpt_carry.py), so
# the run spans machines; lr 10x full fine-tuning's, the trainer's share cut to what it holds
lora=()
if [ "${LORA:-16}" != 0 ]; then
  lora=(trainer.lora.rank=${LORA:-16} trainer.lora.alpha=$(( 2 * ${LORA:-16} )) trainer.optim.lr=${RL_LR:-2e-5}
        resources.trainer.gpu_memory_fraction=0.25)
fi
# the GPU as the experiment shares it (engine 0.2, trainer 0.4, kernel evaluations the rest); the
# split of levels 1 and 2 (the corpus's and bench.model_baseline's); 4 tasks x 4 trajectories x 4
# turns a step; the curve reaches $OUT every 15 s
export KILL_GRACE=${KILL_GRACE:-60}
run_copying "$run" "$out" "$out/rl.log" $(( $(left) - 20 - KILL_GRACE )) python3 -m pipeline.main +experiment=kernel_multiturn_qwen1p5b \
  model.path="$start" reward.tasks=.kb/KernelBench reward.levels=[1,2] "reward.task_ids=[${TASKS}]" "reward.sizes=[${SIZES}]" \
  rollout.n_trajectories=4 pipeline.tasks_per_batch=4 rollout.max_response_length=2048 \
  sandbox.compile_workers=8 sandbox.max_jobs=2 sandbox.cache_dir="$work/build_cache" \
  pipeline.heartbeat_s=30 checkpoint.every=${CKPT_EVERY:-3} checkpoint.keep_last=1 logger=console hydra.run.dir="$run" "${lora[@]}" "$@"
rc=$?
rm -f "$out/timeline.jsonl"
[ -f "$out/rl.log" ] && [ "$(stat -c %s "$out/rl.log")" -gt 12000000 ] && { tail -c 12000000 "$out/rl.log" >"$work/rl.tail"; mv "$work/rl.tail" "$out/rl.log"; }
[ "${LORA:-16}" != 0 ] && python3 -m bench.ckpt_carry pack "$run" "$out"
echo "rl rc=$rc after $((SECONDS - t_start)) s"
grep -E "Error|error:|Traceback" "$out/rl.log" | cut -c1-300 | tail -n 10
grep -E "^\[pipeline\]|^\[step " "$out/rl.log" | cut -c1-400 | tail -n 30
exit $rc
