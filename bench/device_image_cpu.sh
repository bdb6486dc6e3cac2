#!/usr/bin/env bash
# The lent GPU machine's Python stack on the CPU box, to run the tests under it before a device call:
# Python 3.12, torch 2.11 (PyPI's CUDA build, which imports and runs on a CPU with its nvidia
# libraries installed beside it), transformers 5.17, tokenizers 0.23, accelerate 1.15, and the
# triton 3.6 that torch 2.11 pins; the rest as CI pins it (.ci/cpu-constraints.txt).
# The machine's own numpy is 2.5 (PyPI here has up to 2.4.6, used instead).
#
#   bash bench/device_image_cpu.sh [pytest arguments]     # default: the whole suite
#
# Builds an ignored venv at $VENV (default /tmp/device-image, ~6 GB, a few minutes the first time).
# It found torch 2.11's in-place isclose (fixed 2026-12-05) too late, on the H200; on the CPU box it
# found Triton 3.6's interpreter failing loops under numpy 2.4 (sandbox.devices.interpreter_problem).
set -eu
cd "$(dirname "$0")/.."
venv=${VENV:-/tmp/device-image}
py=${PYTHON:-}
if [ -z "$py" ]; then  # the machine's Python is 3.12; pyenv's shim needs its version named
  for c in python3.12 "$(ls -d "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)"; do
    if [ -n "$c" ] && "$c" -V >/dev/null 2>&1; then py=$c; break; fi
  done
  [ -n "$py" ] || { py=python3; echo "no Python 3.12 here: using $(python3 -V)"; }
fi
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q -U pip
  "$venv/bin/pip" install -q torch==2.11.0
fi
if ! "$venv/bin/python" -c "import pipeline, transformers, verl" 2>/dev/null; then
  pins=$(mktemp)
  # CI's pins but for what the machine has in other versions (and what transformers 5.17 needs newer)
  grep -v -E "^(torch|transformers|triton|numpy|tokenizers|accelerate|huggingface_hub|safetensors|regex|nvidia|cuda)" \
    .ci/cpu-constraints.txt >"$pins"
  "$venv/bin/pip" install -q -c "$pins" numpy==2.4.6 -e ".[dev]"
  # verl 0.9.1 asks for transformers < 5.11; the machine runs it beside 5.17, as here (pip says so
  # and exits 0; any other failure stops the script)
  log=$(mktemp)
  "$venv/bin/pip" install -q transformers==5.17.0 tokenizers==0.23.2 accelerate==1.15.0 >"$log" 2>&1 \
    || { cat "$log"; exit 1; }
  grep -v -E "dependency resolver|verl 0.9.1 requires" "$log" || true
  rm -f "$pins" "$log"
fi
"$venv/bin/python" -c "import sys, torch, transformers, triton, numpy; print('python', sys.version.split()[0], \
'torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "${@:-tests}"
