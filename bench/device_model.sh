#!/usr/bin/env bash
# The device calls that carry a fetched model in parts, join it and measure its KernelBench
# baseline (docs/cluster.md "A real model on a machine without a network"; the order and the
# carry lists: bench/device_calls.txt).
#   bash bench/device_model.sh setup NAME           # packages (.devpkgs) once; what is there
#   bash bench/device_model.sh part NAME            # after a call that carried one more part
#   bash bench/device_model.sh join NAME            # parts -> checked GGUF -> /tmp/models/NAME (bf16)
#   bash bench/device_model.sh baseline NAME LABEL [bench.model_baseline args]
# baseline writes $OUT/LABEL.json (+ .jsonl, .log) and prints the summary table last.
set -u
cmd=${1:?setup|part|join|baseline}
name=${2:?model name}
out=${OUT:-/tmp/model_out}
mkdir -p "$out"
if [ "$cmd" != part ]; then
  if [ -d .devpkgs ]; then bash .devpkgs/install.sh >/dev/null 2>&1 || echo "devpkgs install failed"; fi
  [ -f /tmp/site/.done ] || echo "no /tmp/site: carry .devpkgs (setup call)"
fi
. bench/device_env.sh   # /tmp/site (.devpkgs) and /tmp/vsite (the vLLM bundle) on the path
py=python3
case "$cmd" in
  setup)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; df -h /tmp | tail -1
    $py -c "import torch, transformers, vllm, gguf, omegaconf, hydra; print('torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
    ls .kb/KernelBench 2>/dev/null | head -3
    $py -m bench.model_parts status "$name"; true ;;
  part)
    $py -m bench.model_parts status "$name"; true ;;
  join)
    $py -m bench.model_parts join "$name" --out "/tmp/models/$name" ;;
  baseline)
    label=${3:?label}; shift 3
    [ -f "/tmp/models/$name/config.json" ] || { echo "no /tmp/models/$name: run the join call first"; exit 2; }
    $py -m bench.model_baseline --model "/tmp/models/$name" --out "$out/$label.json" \
      --samples "$out/$label.jsonl" "$@" 2>"$out/$label.log"
    rc=$?
    tail -n 15 "$out/$label.log"
    exit $rc ;;
  *) echo "unknown command $cmd"; exit 2 ;;
esac
