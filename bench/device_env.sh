# Sourced by the H200 scripts (bench/device.sh, pipeline_vllm.sh, device_sft_rl.sh), from the
# repository root: the device machine's environment for the project. /tmp/site holds .devpkgs,
# /tmp/vsite the vLLM bundle (../shared/tools/DEVICE-VLLM.md); flashinfer is not in the bundle (its
# sampler must stay off) and the engine runs in the sampler's own process (its weight loads hand
# it tensors, not pickles).
export PYTHONPATH=/tmp/site:/tmp/vsite:$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 \
       TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
       RAY_DEDUP_LOGS=0 WANDB_MODE=disabled

# run_copying RUN_DIR DEST LOG LIMIT_S CMD...: a pipeline run under a hard limit, its
# RUN_DIR/metrics.jsonl and samples.jsonl copied to DEST every 15 s (a call cut by its own limit, or a machine taken
# back after it, still returns the steps it finished), then its metrics and timeline; CMD's status.
# KILL_GRACE (s, default 15): after LIMIT_S the command's own process gets SIGTERM (the pipeline
# finishes its step and writes a checkpoint), then its whole process group SIGKILL this much later.
# Not `timeout`: it signals its whole process group, Ray's GCS and raylet with the driver, and a
# driver whose Ray is gone cannot finish its step (2026-12-07: no checkpoint after the SIGTERM).
run_copying() {
  local run=$1 dest=$2 log=$3 limit=$4 copier watchdog pid rc f hit=/tmp/run_copying.$$.limit
  shift 4
  rm -f "$hit"
  ( while sleep 15; do cp -f "$run/metrics.jsonl" "$run/samples.jsonl" "$dest/" 2>/dev/null; done ) &
  copier=$!
  setsid "$@" >"$log" 2>&1 &   # its own process group: Ray's processes join it, the driver leads it
  pid=$!
  ( sleep "$limit"; touch "$hit"; kill -TERM "$pid"; sleep "${KILL_GRACE:-15}"; kill -KILL -- "-$pid" ) 2>/dev/null &
  watchdog=$!
  wait "$pid"
  rc=$?
  [ -f "$hit" ] && rc=124
  pkill -P "$watchdog" 2>/dev/null; kill "$watchdog" "$copier" 2>/dev/null
  kill -KILL -- "-$pid" 2>/dev/null   # what the driver left running (Ray's daemons)
  rm -f "$hit"
  for f in metrics.jsonl samples.jsonl timeline.png timeline.jsonl; do [ -f "$run/$f" ] && cp "$run/$f" "$dest/"; done
  return $rc
}
