#!/usr/bin/env bash
# KernelBench on the device (H200): the harness self-test on levels 1 and 2, then the throughput
# of our own CUDA answers (bench/kernelbench_answers), inside one time budget.
#   bash bench/device_kernelbench.sh [BUDGET_S=480] [PARTS="selftest answers"]   # ends within ~BUDGET_S + 30 s
# The throughput bars from one device call of < 8 min:
#   bash bench/device_kernelbench.sh 420 selftest
# Needs KernelBench carried as .kb (.kb/KernelBench/level1 ...). Writes into $OUT:
#   env.txt, kernelbench_{selftest,answers}.{json,md,log}  (.md: the summary table, .log: progress)
# The selftest table has: evaluations/min overall, GPU held (admission to its processes gone),
# exclusive (the timing window, alone) and shared (load and correctness) p10/p50/p90 overall and
# per level, and the held window's parts (load, correctness, timing, ref_timing, part_*).
# Each part stops launching evaluations at its share of the budget and waits --drain-s for those in
# flight; what it did not run is listed in its JSON ("not_run", "cancelled") and the .md.
# KB_SETS replaces the sandbox overrides below (space-separated key=value); KB_MAXC the evaluations in flight;
# KB_ARGS more bench.kernelbench arguments (e.g. --estimate-without-peak for an A/B of the admission estimate;
# --answers-per-task 4: four distinct answers to each task launched together, the RL loop's regime,
# where a task's reference time and footprint are measured once for its group).
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
# one run step on a GPU at a time (sandbox.gpu_max_steps=1) and six evaluations in flight per GPU:
# sharing a GPU stretched every step's held window (H100, 2026-12-05: level-1 held p50 3.43 s with
# twelve sharing, 33.7/min), and twelve steps preparing beside the one that holds the GPU slow its
# Python down (1.92 s with the cap, 28.8/min); six in flight keep one step always warm and ready
# (31.4 and 32.5/min, held 1.505 and 1.417 s), five too few (29.7/min, 1.35 s). Inputs are drawn
# on the device, so tasks with large inputs need no host-memory throttle of their own
# (--max-big = in flight)
maxc=${KB_MAXC:-$((6 * ngpu))}
[ "$maxc" -gt "$cores" ] && maxc=$cores
# the sandbox's defaults (5 trials, 3 warm-up and 20 timed calls, 2 timing buffers, limits sized
# from the task) but for the build workers of the answers part and the one step a GPU above
sets=${KB_SETS:-"compile_workers=8 max_jobs=2 gpu_max_steps=1"}
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
    --max-concurrent "$maxc" --max-big "$maxc" --budget-s "$b" --drain-s "$drain" --out "$out/kernelbench_$name.json" \
    "${setargs[@]}" ${KB_ARGS:-} "$@" >"$out/kernelbench_$name.md" 2>"$out/kernelbench_$name.log"
  echo "=== $name rc=$? in $((SECONDS - t0))s"
  cat "$out/kernelbench_$name.md"
  tail -n 6 "$out/kernelbench_$name.log"
}

# interleaved (L1/1, L2/1, L1/2, ...): a run cut by its budget covers both levels and every size
# alike, so the per-level GPU-held figures are not biased toward the small tasks
share=55; [[ " $parts " == *" answers "* ]] || share=100
if [[ " $parts " == *" selftest "* ]]; then
  part selftest $((budget * share / 100 - (SECONDS - t_start) - 50)) 30 --levels 1 2 --order interleave
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
