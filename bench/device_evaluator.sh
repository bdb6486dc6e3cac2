#!/usr/bin/env bash
# The evaluator's figures in one device call (carry .devpkgs and .kb): whether GPU steps fork from
# the zygote (its gpu tests), a cache hit's overhead on cuda, distinct cold evaluations a minute of
# the project's answers (3 distinct builds of each), then, with the time left, the order of the
# timed windows (bench.timing_order), the red team and builds per added Ray node.
#   TOTAL=560 bash bench/device_evaluator.sh [PARTS="zygote overhead answers order redteam nodes"]
# zygote_gpu_steps is on for the later parts only where the zygote's gpu tests passed in this call.
# Writes under $OUT: zygote_gpu_tests.log, eval_overhead_cuda_zygote.json, kernelbench_answers.*,
# timing_order_cuda.json, redteam_cuda_zygote.json, build_pool.json (+ .log of each).
set -u
T0=$SECONDS
TOTAL=${TOTAL:-560}
parts=" ${1:-zygote overhead answers order redteam nodes} "
out=${OUT:-/tmp/evaluator_out}
mkdir -p "$out"
bash .devpkgs/install.sh >/dev/null 2>&1 || echo "devpkgs install failed"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
left() { echo $((TOTAL - (SECONDS - T0) - 10)); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
python3 -c "import torch; from sandbox.zygote import driver_loaded, driver_started; print('after import torch: libcuda', driver_loaded(), 'started', driver_started()); torch.zeros(1, device='cuda'); print('after a CUDA tensor: started', driver_started())"
zy=false
if [[ $parts == *" zygote "* ]]; then
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/sandbox/test_zygote.py -m gpu >"$out/zygote_gpu_tests.log" 2>&1 \
    && ! grep -q skipped "$out/zygote_gpu_tests.log" && zy=true
  tail -n 6 "$out/zygote_gpu_tests.log"
fi
echo "zygote_gpu_steps=$zy"
if [[ $parts == *" overhead "* ]]; then
  timeout 100 python3 -m bench.eval_overhead --backend cuda --evals 4 --repeats 1 \
    --out "$out/eval_overhead_cuda_zygote.json" >"$out/eval_overhead.log" 2>&1
  echo "eval_overhead rc=$?"; tail -n 14 "$out/eval_overhead.log"
fi
if [[ $parts == *" answers "* ]]; then
  KB_MAXC=16 KB_SETS="compile_workers=8 max_jobs=2 gpu_max_steps=1 zygote_gpu_steps=$zy" KB_ARGS="--variants 3" \
    bash bench/device_kernelbench.sh 200 answers 2>&1 | tail -n 40
fi
if [[ $parts == *" order "* ]] && [ "$(left)" -ge 60 ]; then
  timeout "$(left)" python3 -m bench.timing_order --backend cuda --tasks L1/17_relu,L1/19_silu --evals 4 \
    --out "$out/timing_order_cuda.json" >"$out/timing_order.log" 2>&1
  echo "timing_order rc=$?"; tail -n 14 "$out/timing_order.log"
fi
if [[ $parts == *" redteam "* ]] && [ "$(left)" -ge 120 ]; then
  timeout "$(left)" python3 -m bench.redteam --backend cuda --compile-workers 8 --budget $(( $(left) - 40 )) \
    --set zygote_gpu_steps=$zy --out "$out/redteam_cuda_zygote.json" >"$out/redteam.log" 2>&1
  echo "redteam rc=$?"; grep -A12 '"unexpected"' "$out/redteam.log" | head -n 14
fi
if [[ $parts == *" nodes "* ]] && [ "$(left)" -ge 90 ]; then
  timeout "$(left)" python3 -m bench.build_pool --nodes 1,2,4 --cpus-per-node 2 --answers 8 --no-local \
    --out "$out/build_pool.json" >"$out/build_pool.log" 2>&1
  echo "build_pool rc=$?"; tail -n 10 "$out/build_pool.log"
fi
echo "total $((SECONDS - T0)) s"
