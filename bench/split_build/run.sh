#!/usr/bin/env bash
# Proof of concept of the split C++ build (docs/sandbox.md, "Where a cold C++ build's time goes"):
# one answer (L1/21_sigmoid's cpp_sources, made distinct) compiled on a PCH of the `min` tier
# (sandbox/build.py MIN_TYPES_H), a C PyInit, and a link with two trusted objects built once
# (runtime.cpp: the module; binder_T_T.cpp: torch's m.def for a Tensor(Tensor) function, on the
# PCH of torch/extension.h); then the module is loaded and checked against torch's own build.
# The sandbox's own form of it, with generated binders: sandbox/split_build.py (SandboxConfig split_build).
# Prints g++ wall / user seconds per step.
#   bash bench/split_build/run.sh [WORKDIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
W=${1:-$(mktemp -d /tmp/split_build.XXXXXX)}; mkdir -p "$W"; cd "$W"
export PYTHONPATH=$ROOT
FLAGS='["-O3", "-ffast-math", "-march=native", "-fopenmp"]'
python - "$FLAGS" <<'PY' > vars.sh
import json, sys, sysconfig
from torch.utils import cpp_extension
from rewards.solutions import load_solution
from sandbox import build
flags = json.loads(sys.argv[1])
src = load_solution("cpu", "L1/21_sigmoid")
cpp = src.split('r"""', 1)[1].split('"""', 1)[0]
open("answer.cpp", "w").write(f"// split-build {__import__('time').time()}\n{cpp}\n"
    'extern "C" void* sbx_fn_0() { return reinterpret_cast<void*>(&sigmoid_forward); }\n')
open("torch_main.cpp", "w").write(  # torch's own main.cpp of this answer, for the comparison
    "#include <torch/extension.h>\n" + cpp + "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
    'm.def("sigmoid_forward", torch::wrap_pybind_function(sigmoid_forward), "sigmoid_forward");\n}\n')
build.write_narrow_header("nh")
print(f"CF='{' '.join(build.pch_cflags(flags))}'")
print(f"L='{cpp_extension.library_paths()[0]}'")
PY
. ./vars.sh
t() { /usr/bin/time -f "$1: %e s wall %U s user" "${@:2}"; }
mkdir -p pch/torch minpch/torch
echo "# trusted, once per flag set (the PCHs) and per signature (the binder)"
t pch_extension_h g++ -x c++-header "$(python -c 'from torch.utils import cpp_extension as c; print(c.include_paths()[0])')/torch/extension.h" -o pch/torch/extension.h.gch $CF
printf '#pragma once\n#include_next <torch/extension.h>\n' > pch/torch/extension.h
t pch_min_tier g++ -x c++-header nh/min/torch/extension.h -o minpch/torch/extension.h.gch -Inh/min $CF
cp nh/min/torch/extension.h minpch/torch/extension.h
t runtime g++ -Ipch $CF -Winvalid-pch -c "$HERE/runtime.cpp" -o runtime.o
t binder g++ -Ipch $CF -Winvalid-pch -c "$HERE/binder_T_T.cpp" -o binder_T_T.o
echo "# per answer"
t answer g++ -Iminpch -Inh/min $CF -Winvalid-pch -c answer.cpp -o answer.o
t pyinit gcc -O2 -fPIC -c "$HERE/pyinit.c" -o pyinit.o
t link g++ answer.o pyinit.o runtime.o binder_T_T.o -shared -fopenmp -L"$L" -lc10 -ltorch_cpu -ltorch -ltorch_python -o sbx_sigmoid.so
echo "# for comparison: torch's main.cpp of the same answer, plain and on the PCH (the sandbox now)"
t plain_main_cpp g++ -DTORCH_EXTENSION_NAME=x $CF -c torch_main.cpp -o torch_main.o
t pch_main_cpp g++ -DTORCH_EXTENSION_NAME=x -Ipch $CF -Winvalid-pch -c torch_main.cpp -o torch_main.o
python - <<'PY'
import importlib.util, torch
spec = importlib.util.spec_from_file_location("sbx_sigmoid", "sbx_sigmoid.so")
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
x = torch.randn(1 << 20)
assert torch.allclose(m.sigmoid_forward(x), torch.sigmoid(x), atol=1e-6)
print("split module works:", m.sigmoid_forward.__doc__.strip().splitlines()[0])
PY
