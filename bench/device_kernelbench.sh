#!/usr/bin/env bash
# KernelBench on the device (H200): the harness self-test on levels 1 and 2, then the throughput
# of our own CUDA answers (bench/kernelbench_answers), inside one time budget.
#   bash bench/device_kernelbench.sh [BUDGET_S=480] [PARTS="selftest answers"]   # ends within ~BUDGET_S + 30 s
# Needs KernelBench carried as .kb (.kb/KernelBench/level1 ...). Writes 7 files into $OUT:
#   env.txt, kernelbench_{selftest,answers}.{json,md,log}  (.md: the summary table, .log: progress)
# Each part stops launching evaluations at its share of the budget and waits --drain-s for those in
# flight; what it did not run is listed in its JSON ("not_run", "cancelled") and the .md.
# KB_SETS replaces the sandbox overrides below (space-separated key=value).
set -u
budget=${1:-480}
parts=${2:-selftest answers}
t_start=$SECONDS   # the package install counts against the budget too
out=${OUT:-/tmp/kb_out}
mkdir -p "$out"
if [ -d .devpkgs ]; then bash .devpkgs/install.sh >/dev/null 2>&1 || echo "devpkgs install failed"; fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
py=python3
root=.kb/KernelBench
[ -d "$root/level1" ] || root=.kb
[ -d "$root/level1" ] || { echo "no KernelBench under .kb (carry it)"; exit 2; }

ngpu=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$ngpu" -ge 1 ] || ngpu=1
cores=$(nproc)
# one run step per GPU holds it; a few more evaluations per GPU start their workers meanwhile
# (import torch, load the task) so the GPU never waits, without many in flight when the budget ends
maxc=$((4 * ngpu))
# the GPU holder draws the inputs on the host (torch.rand, ~3 s/GB on one thread): the harness and
# the candidate process each get a share of the cores
threads=$((cores / (2 * ngpu))); [ "$threads" -gt 8 ] && threads=8; [ "$threads" -lt 1 ] && threads=1
# KernelBench's sizes (measured on the meta device: 60/100 level-1 tasks have inputs > 1 GB, up to
# 17 GB; 51 have outputs > 1 GB): with the defaults (5 trials, 2 timing input sets, 16 GiB of host
# memory, 4 GiB file size for the saved outputs) most of level 1 would fail on limits or take
# minutes each. Fewer host draws, room for the output file and the host copies; timing unchanged.
sets=${KB_SETS:-"correctness_trials=2 timing_input_sets=1 cpu_threads=$threads memory_limit_bytes=$((64 * 2**30)) \
max_file_size_bytes=$((40 * 2**30)) run_timeout_s=240 compile_workers=8 max_jobs=2"}
setargs=(); for s in $sets; do setargs+=(--set "$s"); done

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; echo "cores=$cores gpus=$ngpu";
  df -h /tmp | tail -1; free -g | head -2; git rev-parse HEAD 2>/dev/null; echo "budget=$budget sets=$sets";
  $py -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } >"$out/env.txt" 2>&1
cat "$out/env.txt"

part() {  # part NAME BUDGET_S DRAIN_S ARGS...: bench.kernelbench under a hard limit past its budget
  local name=$1 b=$2 drain=$3; shift 3
  local t0=$SECONDS
  echo "=== $name: budget ${b}s, drain ${drain}s"
  timeout -k 10 $((b + drain + 45)) $py -m bench.kernelbench --root "$root" --backend cuda \
    --max-concurrent "$maxc" --budget-s "$b" --drain-s "$drain" --out "$out/kernelbench_$name.json" \
    "${setargs[@]}" "$@" >"$out/kernelbench_$name.md" 2>"$out/kernelbench_$name.log"
  echo "=== $name rc=$? in $((SECONDS - t0))s"
  cat "$out/kernelbench_$name.md"
  tail -n 6 "$out/kernelbench_$name.log"
}

# small-first: the most tasks inside the budget; the ones left are the largest, listed as not run
share=55; [[ " $parts " == *" answers "* ]] || share=85
if [[ " $parts " == *" selftest "* ]]; then
  part selftest $((budget * share / 100 - (SECONDS - t_start))) 30 --levels 1 2 --order small-first
fi
left=$((budget - (SECONDS - t_start) - 30 - 20))
if [[ " $parts " != *" answers "* ]]; then
  :
elif [ "$left" -ge 60 ]; then
  part answers "$left" 30 --answers bench/kernelbench_answers --cached-rounds 1
else
  echo "=== answers skipped: ${left}s of the budget left" | tee "$out/kernelbench_answers.md"
fi
echo "=== total $((SECONDS - t_start))s"
