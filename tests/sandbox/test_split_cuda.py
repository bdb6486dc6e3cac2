"""The split CUDA build (sandbox/split_cuda.py, sandbox/cu_split.py).

Without a GPU (the CPU box): the splitter on every CUDA answer of the project and on model-like
answers (what splits, what falls back and why), and real compiles: nvcc on the device unit (no
torch header reaches it), g++ on the host unit and the ``cpp_sources`` + tail unit on the ``min``
PCH, the launch stubs the host unit calls defined by the device unit with the same mangled type
(``nm``). A CPU torch has no libc10_cuda / libtorch_cuda to link against, so the module is built,
loaded and run only where a GPU and a CUDA torch are (``gpu`` tests at the end: the lead runs them
on the GPU machine)."""
import ast
import glob
import inspect
import json
import os
import subprocess
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch.utils import cpp_extension

from rewards.corpus import corpus_answers
from sandbox import build, split_build, split_cuda
from sandbox.cu_split import Doubt, Split, prototypes

ROOT = Path(__file__).resolve().parents[2]
KB_ANSWERS = sorted(glob.glob(str(ROOT / "bench" / "kernelbench_answers" / "*.py")))

# --- model-like answers: what 1.5B-class models and KernelBench answers write ----------------------
MACROS_TWO_KERNELS = r'''
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

#define CHECK_CUDA(x) TORCH_CHECK(x.is_cuda(), #x " must be a CUDA tensor")
#define CHECK_CONTIGUOUS(x) TORCH_CHECK(x.is_contiguous(), #x " must be contiguous")
#define CHECK_INPUT(x) CHECK_CUDA(x); CHECK_CONTIGUOUS(x)
#define BLOCK_SIZE 256

__device__ __forceinline__ float sq(float v) { return v * v; }

// a grid-stride loop; this comment mentions kernel<<<grid, block>>>(x) and "a string"
__global__ void square_kernel(const float* in, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) out[i] = sq(in[i]);
}

/* add_scalar<<<1, 1>>>() in a block comment */
__global__ void add_scalar_kernel(float* data, float s, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) data[i] += s;
}

torch::Tensor square_plus(torch::Tensor x, double s) {
    CHECK_INPUT(x);
    auto out = torch::empty_like(x);
    int n = x.numel();
    const char* note = "launch<<<grid, block>>>(x) in a string; '}' too";
    const char quote = '"';
    int blocks = (n + BLOCK_SIZE - 1) / BLOCK_SIZE;
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    square_kernel<<<blocks, BLOCK_SIZE, 0, stream>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    add_scalar_kernel<<<dim3(blocks), dim3(BLOCK_SIZE)>>>(out.data_ptr<float>(), (float)s, out.numel());
    (void)note; (void)quote;
    return out;
}
'''
STRUCTS_SHARED = r'''
#include <torch/extension.h>
#include <cstdint>

constexpr int TILE = 16;
const float kScale = 1.0f;
struct Shape { int rows; int cols; };
typedef unsigned int uint_t;
extern __shared__ float smem[];

__global__ void transpose_kernel(const float* __restrict__ in, float* __restrict__ out, Shape s, int /*unused*/) {
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x, y = blockIdx.y * TILE + threadIdx.y;
    if (x < s.cols && y < s.rows) tile[threadIdx.y][threadIdx.x] = in[y * s.cols + x] * kScale;
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x; y = blockIdx.x * TILE + threadIdx.y;
    if (x < s.rows && y < s.cols) out[y * s.rows + x] = tile[threadIdx.x][threadIdx.y];
}

__global__ void rowsum_kernel(const float* x, float* y, uint_t cols, int64_t) {
    float acc = 0.f;
    for (uint_t c = threadIdx.x; c < cols; c += blockDim.x) acc += x[blockIdx.x * cols + c];
    smem[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) smem[threadIdx.x] += smem[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) y[blockIdx.x] = smem[0];
}

static int cdiv(int a, int b) { return (a + b - 1) / b; }

torch::Tensor transpose(torch::Tensor x) {
    const int r = x.size(0), c = x.size(1);
    auto out = torch::empty({c, r}, x.options());
    dim3 block(TILE, TILE), grid(cdiv(c, TILE), cdiv(r, TILE));
    transpose_kernel<<<grid, block>>>(x.data_ptr<float>(), out.data_ptr<float>(), Shape{r, c}, 0);
    return out;
}

torch::Tensor rowsum(torch::Tensor x) {
    auto y = torch::empty({x.size(0)}, x.options());
    rowsum_kernel<<<x.size(0), 256, 256 * sizeof(float)>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.size(1), 0);
    return y;
}
'''
# a kernel whose parameter shares its name with a struct member, and an empty argument list
NAMES = r'''
#include <torch/extension.h>
struct P { float* x; int n; };
__global__ void fill_kernel(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = 1.f; }
__global__ void nothing_kernel() {}
torch::Tensor fill(torch::Tensor t) {
    nothing_kernel<<<1, 1>>>();
    fill_kernel<<<1, 32>>>(t.data_ptr<float>(), (int)t.numel());
    return t;
}
'''
FALLBACKS = {
    "templated kernel": r'''
#include <torch/extension.h>
template <typename scalar_t>
__global__ void relu_kernel(const scalar_t* x, scalar_t* y, int n) { int i = threadIdx.x; if (i < n) y[i] = x[i] > 0 ? x[i] : 0; }
torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "relu", [&] {
        relu_kernel<scalar_t><<<1, 256>>>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), x.numel());
    });
    return y;
}''',
    "cudaMemcpyToSymbol": r'''
#include <torch/extension.h>
__constant__ float c_w[16];
__global__ void k(const float* x, float* y) { y[threadIdx.x] = x[threadIdx.x] * c_w[threadIdx.x]; }
torch::Tensor f(torch::Tensor x, torch::Tensor w) {
    auto y = torch::empty_like(x);
    cudaMemcpyToSymbol(c_w, w.data_ptr<float>(), 16 * sizeof(float));
    k<<<1, 16>>>(x.data_ptr<float>(), y.data_ptr<float>());
    return y;
}''',
    "kernel named outside a launch": r'''
#include <torch/extension.h>
__global__ void k(float* y) { y[threadIdx.x] = 0.f; }
torch::Tensor f(torch::Tensor y) {
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
    k<<<1, 16>>>(y.data_ptr<float>());
    return y;
}''',
    "macro holding a launch": r'''
#include <torch/extension.h>
#define LAUNCH(kern, n, ...) kern<<<((n) + 255) / 256, 256>>>(__VA_ARGS__)
__global__ void k(float* y, int n) { int i = blockIdx.x * 256 + threadIdx.x; if (i < n) y[i] = 0.f; }
torch::Tensor f(torch::Tensor y) { LAUNCH(k, y.numel(), y.data_ptr<float>(), (int)y.numel()); return y; }''',
    "torch type in device code": r'''
#include <torch/extension.h>
__global__ void k(c10::Half* y) { y[threadIdx.x] = 0; }
torch::Tensor f(torch::Tensor y) { k<<<1, 16>>>(y.data_ptr<c10::Half>()); return y; }''',
    "thrust": r'''
#include <torch/extension.h>
#include <thrust/device_ptr.h>
__global__ void k(float* y) { y[threadIdx.x] = 0.f; }
torch::Tensor f(torch::Tensor y) { k<<<1, 16>>>(y.data_ptr<float>()); return y; }''',
    "namespace": r'''
#include <torch/extension.h>
namespace { __global__ void k(float* y) { y[threadIdx.x] = 0.f; } }
torch::Tensor f(torch::Tensor y) { k<<<1, 16>>>(y.data_ptr<float>()); return y; }''',
    "launch from a kernel": r'''
#include <torch/extension.h>
__global__ void child(float* y) { y[threadIdx.x] = 0.f; }
__global__ void parent(float* y) { child<<<1, 16>>>(y); }
torch::Tensor f(torch::Tensor y) { parent<<<1, 1>>>(y.data_ptr<float>()); return y; }''',
    "extern C": r'''
#include <torch/extension.h>
__global__ void k(float* y) { y[threadIdx.x] = 0.f; }
extern "C" void launch(float* y) { k<<<1, 16>>>(y); }
torch::Tensor f(torch::Tensor y) { launch(y.data_ptr<float>()); return y; }''',
    "device lambda in host code": r'''
#include <torch/extension.h>
__global__ void k(float* y) { y[threadIdx.x] = 0.f; }
torch::Tensor f(torch::Tensor y) { auto g = [] __device__ (float v) { return v; }; k<<<1, 16>>>(y.data_ptr<float>()); return y; }''',
    "__CUDACC__ in host code": r'''
#include <torch/extension.h>
__global__ void k(float* y) { y[threadIdx.x] = 0.f; }
torch::Tensor f(torch::Tensor y) {
#ifdef __CUDACC__
    k<<<1, 16>>>(y.data_ptr<float>());
#endif
    return y;
}''',
    "unbalanced text": r'''
#include <torch/extension.h>
__global__ void k(float* y) { y[threadIdx.x] = 0.f;
torch::Tensor f(torch::Tensor y) { k<<<1, 16>>>(y.data_ptr<float>()); return y; }''',
}


def captured_calls(src: str) -> list[dict]:
    """The ``load_inline`` calls an answer makes, captured (nothing built)."""
    calls = []
    with mock.patch.object(cpp_extension, "load_inline", lambda **kw: calls.append(kw) or mock.MagicMock()):
        exec(compile(src, "answer", "exec"), {"__name__": "answer"})
    return calls


def project_calls(variants: tuple[str, ...] = ("fast", "slow", "wrong")) -> dict[str, dict]:
    """The CUDA answers of the project that must build: the corpus's (all but "broken") and bench/kernelbench_answers."""
    out = {f"{a.task_id} {a.variant}": captured_calls(a.code)[0] for a in corpus_answers("cuda") if a.variant in variants}
    out.update({Path(p).stem: captured_calls(Path(p).read_text())[0] for p in KB_ANSWERS})
    return out


def hand_call(name: str, cu: str, functions: list[str], decls: str) -> dict:
    return {"name": name, "cpp_sources": decls, "cuda_sources": cu, "functions": functions, "extra_cuda_cflags": ["-O3"]}


# torch's main.cpp holding code of its own (a C++ wrapper around the .cu's launcher): a unit of its own
WRAPPER_CPP = ("torch::Tensor fill_cuda(torch::Tensor t);\n"
               "torch::Tensor fill_twice(torch::Tensor t) { fill_cuda(t); return fill_cuda(t); }\n")
WRAPPER_CU = NAMES.replace("torch::Tensor fill(", "torch::Tensor fill_cuda(")

HAND = {
    "macros_two_kernels": hand_call("macros_two_kernels", MACROS_TWO_KERNELS, ["square_plus"],
                                    "torch::Tensor square_plus(torch::Tensor x, double s);"),
    "structs_shared": hand_call("structs_shared", STRUCTS_SHARED, ["transpose", "rowsum"],
                                "torch::Tensor transpose(torch::Tensor x);\ntorch::Tensor rowsum(torch::Tensor x);"),
    "names": hand_call("names", NAMES, ["fill"], "torch::Tensor fill(torch::Tensor t);"),
    "wrapper": hand_call("wrapper", WRAPPER_CU, ["fill_twice"], WRAPPER_CPP),
    # a macro from extra_cuda_cflags, used by device and host code (both units get it; main.cpp stays apart)
    "flag_macro": {**hand_call("flag_macro", NAMES.replace("fill_kernel<<<1, 32>>>", "fill_kernel<<<1, THREADS>>>")
                               .replace("int i = threadIdx.x;", "int i = threadIdx.x % THREADS;"),
                               ["fill"], "torch::Tensor fill(torch::Tensor t);"),
                   "extra_cuda_cflags": ["-O3", "-DTHREADS=32"]},
}


def test_every_project_cuda_answer_splits():
    calls = project_calls()
    assert len(calls) >= 40
    for label, call in calls.items():
        assert split_cuda.applies(call), label
        s = Split(call["cuda_sources"])
        assert s.kernels and "<<<" not in s.host.split("struct sbx_launch_config")[0], label
        assert "torch/" not in s.device and "c10/" not in s.device, label


def test_model_like_answers_split_with_stubs_in_place_of_launches():
    s = Split(MACROS_TWO_KERNELS)
    assert set(s.kernels) == {"square_kernel", "add_scalar_kernel"}
    assert "sbx_launch_square_kernel(sbx_launch_config(blocks, BLOCK_SIZE, 0, stream), x.data_ptr<float>()" in s.host
    assert "sbx_launch_add_scalar_kernel(sbx_launch_config(dim3(blocks), dim3(BLOCK_SIZE)), out" in s.host
    assert '"launch<<<grid, block>>>(x) in a string; \'}\' too"' in s.host  # strings and comments untouched
    assert "#define CHECK_INPUT(x)" in s.device and "__device__ __forceinline__ float sq" in s.device
    assert "torch::Tensor" not in s.device and "__global__" not in s.host
    t = Split(STRUCTS_SHARED)
    # the unnamed parameters get names; the struct, typedef and constants are in both units
    assert "Shape s, int sbx_a3/*unused*/) { transpose_kernel<<<" in t.device and "(in, out, s, sbx_a3)" in t.device
    assert "int64_t sbx_a3) { rowsum_kernel<<<" in t.device
    for both in ("struct Shape", "typedef unsigned int uint_t;", "constexpr int TILE", "const float kScale"):
        assert both in t.device and both in t.host, both
    assert "extern __shared__ float smem[];" in t.device and "smem" not in t.host
    assert "static int cdiv" in t.host and "static int cdiv" not in t.device
    n = Split(NAMES)
    assert "fill_kernel(sbx_launch_config sbx_c, float* x, int n)" in n.device  # x and n, though P has x and n
    assert "sbx_launch_nothing_kernel(sbx_launch_config(1, 1));" in n.host


def test_main_cpp_joins_the_host_unit_only_when_that_changes_nothing(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # commands() asks torch for the arch flags
    assert prototypes("#include <torch/extension.h>\n// f\ntorch::Tensor f(torch::Tensor x, double s = 1.0);\n"
                      "at::Tensor g(const at::Tensor& a);") == ["f", "g"]
    for not_only_declarations in (WRAPPER_CPP, "#define N 4\ntorch::Tensor f(torch::Tensor x);",
                                  "using namespace torch;\nTensor f(Tensor x);", "struct S {};"):
        assert prototypes(not_only_declarations) is None, not_only_declarations
    for label, call in project_calls(("fast",)).items():  # every project answer: two units
        assert set(split_cuda.units(call, split_cuda.applies(call))) == {"device", "host"}, label
    assert set(split_cuda.units(HAND["wrapper"], {"fill_twice": "fill_twice"})) == {"device", "host", "main"}
    # a -D of extra_cuda_cflags reaches the .cu's host code, not main.cpp: main.cpp stays apart
    assert set(split_cuda.units(HAND["flag_macro"], {"fill": "fill"})) == {"device", "host", "main"}
    assert "-DTHREADS=32" in split_cuda.commands(HAND["flag_macro"], "/r", Path("/o"))["host"]
    # the .cu's host code uses a function main.cpp declares before declaring it itself: under torch
    # that does not compile, so main.cpp's declarations stay out of its unit
    cu = NAMES.replace("torch::Tensor fill(torch::Tensor t) {", "torch::Tensor helper(torch::Tensor t);\n"
                       "torch::Tensor fill(torch::Tensor t) {\n    helper(t);")
    early = hand_call("early", cu, ["fill"], "torch::Tensor fill(torch::Tensor t);\ntorch::Tensor helper(torch::Tensor t);")
    assert set(split_cuda.units(early, {"fill": "fill"})) == {"device", "host"}
    used_first = hand_call("used_first", NAMES.replace("torch::Tensor fill(torch::Tensor t) {",
                                                       "torch::Tensor fill(torch::Tensor t) {\n    other(t);"),
                           ["fill"], "torch::Tensor fill(torch::Tensor t);\ntorch::Tensor other(torch::Tensor t);")
    assert set(split_cuda.units(used_first, {"fill": "fill"})) == {"device", "host", "main"}


def test_a_kernel_with_launch_bounds_and_std_in_device_code_splits():
    s = Split("#include <torch/extension.h>\n"
              "__global__ void __launch_bounds__(256) k(float* y, int n) { int i = threadIdx.x; y[i] = std::min(i, n); }\n"
              "constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }\n"
              "__global__ void j(float* y) { y[threadIdx.x] = cdiv(4, 2); }\n"
              "torch::Tensor f(torch::Tensor y) { k<<<1, 256>>>(y.data_ptr<float>(), 3); j<<<1, 1>>>(y.data_ptr<float>());"
              " return y; }\n")
    assert set(s.kernels) == {"k", "j"} and "sbx_launch_k(sbx_launch_config sbx_c, float* y, int n)" in s.device
    assert "#include <algorithm>" in s.device  # torch/types.h would have brought it
    assert "constexpr int cdiv" in s.device and "constexpr int cdiv" in s.host


@pytest.mark.parametrize("why", sorted(FALLBACKS))
def test_what_the_splitter_is_not_sure_of_falls_back(why):
    with pytest.raises(Doubt):
        Split(FALLBACKS[why])


def test_calls_the_cuda_split_does_not_take():
    call = hand_call("c", NAMES, ["fill"], "torch::Tensor fill(torch::Tensor t);")
    assert split_cuda.applies(call) == {"fill": "fill"}
    assert split_cuda.applies({**call, "extra_cflags": ["-O3"], "extra_cuda_cflags": ["-O3", "-DN=4", "--use_fast_math"]})
    for change in ({"cuda_sources": None}, {"extra_cflags": ["-O1"]}, {"with_cuda": False}, {"build_directory": "/x"},
                   {"cpp_sources": "#include <pybind11/pybind11.h>\n"}, {"no_implicit_headers": True},
                   # what would change the .cu's host code, which g++ compiles here with the PCH's flags
                   {"extra_cflags": ["-O3", "-ffast-math"]}, {"extra_cuda_cflags": ["-Xcompiler", "-ffast-math"]},
                   {"extra_cuda_cflags": ["--compiler-options=-O0"]}):
        assert split_cuda.applies({**call, **change}) is None, change


def test_an_answer_naming_an_sbx_symbol_fails_the_build(tmp_path):
    for cu in (NAMES.replace("fill_kernel", "sbx_launch_fill_kernel"), NAMES + "\nint sbx_anything = 1;\n"):
        call = hand_call("hostile", cu, ["fill"], "torch::Tensor fill(torch::Tensor t);")
        with pytest.raises(split_build.ReservedSymbol, match="Error building extension 'hostile'.*reserved symbol"):
            split_cuda.build_module(call, {"fill": "fill"}, tmp_path / "split", tmp_path)
    assert not split_build.module_path(tmp_path, "hostile").exists()
    # text the scanner cannot read (an unterminated comment) is not a verdict: it falls back
    call = hand_call("unread", NAMES + "\n/* never closed", ["fill"], "torch::Tensor fill(torch::Tensor t);")
    assert split_cuda.build_module(call, {"fill": "fill"}, tmp_path / "split", tmp_path) is None


# --- real compiles (nvcc and g++; CPU torch: no link) ------------------------------------------------

@pytest.fixture(scope="module")
def trusted(split_cache) -> Path:
    """The split build's trusted parts for the flag set CUDA answers use (none): the session's
    library (tests/sandbox/conftest.py ``split_cache``) and a min PCH for no flags beside its own."""
    root = split_cache / "split"
    split_build.build_trusted(root, [])
    return root


@pytest.fixture
def cuda_env(monkeypatch, tmp_path):
    """nvcc's root for a CPU torch (it never looks for one), one arch, and the generated c10/cuda
    header CPU wheels lack (one macro), so the host unit's c10/cuda includes compile."""
    if not torch.version.cuda:
        found = sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))
        home = os.environ.get("CUDA_HOME") or (str(found[-1].parents[1]) if found else None)
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", home)
        shim = tmp_path / "shim" / "c10" / "cuda" / "impl"
        shim.mkdir(parents=True)
        (shim / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        monkeypatch.setenv("CPATH", str(tmp_path / "shim"))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"))


@pytest.mark.slow
@pytest.mark.skipif(not Path(cpp_extension.CUDA_HOME or "/usr/local/cuda").joinpath("bin", "nvcc").exists()
                    and not glob.glob("/usr/local/cuda*/bin/nvcc"), reason="needs nvcc")
def test_the_units_compile_without_torch_for_nvcc_and_their_stubs_match(trusted, cuda_env, tmp_path):
    calls = {**project_calls(("fast",)), **HAND}  # the solutions (slow and wrong split alike: the test above)
    torch_include = str(Path(cpp_extension.include_paths()[0]))
    failed = {}
    for k, (label, call) in enumerate(calls.items()):
        out = tmp_path / f"u{k}"
        texts = split_cuda.units(call, split_cuda.applies(call))
        cmds = split_cuda.commands(call, trusted, out, tuple(texts))
        assert not any(torch_include in a for a in cmds["device"])  # nvcc gets no torch include path at all
        if not split_cuda.compile_objects(call, texts, cmds, out):
            failed[label] = [(out / f"{u}.log").read_text()[-1500:] for u in ("device", "host", "main")]
            continue
        host = split_cuda._symbols(out / "host.o")[1]
        device = split_cuda._symbols(out / "device.o")[0]
        assert sum("sbx_launch_" in s for s in host) == len(Split(call["cuda_sources"]).kernels), label
        assert split_cuda.stubs_match(host, device), label
    assert not failed, json.dumps(failed, indent=1)[:6000]
    # the device unit's headers, as nvcc's preprocessor lists them: not one from torch
    deps = subprocess.run([*cmds["device"][:-2], "-M"], capture_output=True, text=True, check=True).stdout
    assert "cuda_runtime.h" in deps and torch_include not in deps and "/torch/" not in deps


# On a CPU torch: the three functions of libc10_cuda a split host unit calls, so that the module
# links and loads here (libtorch_cuda: an empty library; libcudart: the toolkit's, no device).
STAND_IN_C10_CUDA = r'''
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
namespace c10::cuda {
CUDAStream getCurrentCUDAStream(DeviceIndex) {
  return CUDAStream(CUDAStream::UNCHECKED, Stream(Stream::DEFAULT, Device(DeviceType::CUDA, 0)));
}
cudaStream_t CUDAStream::stream() const { return nullptr; }
void c10_cuda_check_implementation(const int32_t err, const char*, const char*, uint32_t, const bool) {
  TORCH_CHECK(err == 0, "CUDA error ", err, " (stand-in libc10_cuda)");
}
}  // namespace c10::cuda
'''


@pytest.mark.slow
@pytest.mark.skipif(bool(torch.version.cuda), reason="a CUDA torch links the real libraries: the gpu tests below")
def test_a_split_module_links_loads_binds_and_launches_with_stand_in_cuda_libraries(trusted, cuda_env, tmp_path,
                                                                                   monkeypatch):
    import ctypes

    home = split_cuda.cuda_home()
    cudart = sorted(Path(home).glob("lib*/libcudart.so.*"))
    if not cudart:
        pytest.skip(f"no libcudart under {home}")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "c10_cuda.cpp").write_text(STAND_IN_C10_CUDA)
    (fake / "empty.cpp").write_text("void stand_in_torch_cuda() {}\n")
    includes = [a for p in cpp_extension.include_paths() for a in ("-isystem", p)]
    torch_lib = cpp_extension.library_paths()[0]
    for lib, src, extra in (("c10_cuda", "c10_cuda.cpp", [f"-L{torch_lib}", "-lc10"]), ("torch_cuda", "empty.cpp", [])):
        subprocess.run(["c++", "-shared", "-fPIC", "-std=c++17", str(fake / src), "-o", str(fake / f"lib{lib}.so"),
                        f"-Wl,-soname,lib{lib}.so", *includes, "-isystem", os.path.join(home, "include"), *extra],
                       check=True, capture_output=True)
        ctypes.CDLL(str(fake / f"lib{lib}.so"), mode=ctypes.RTLD_GLOBAL)  # the module's NEEDED, by soname
    runtime = ctypes.CDLL(str(cudart[-1]), mode=ctypes.RTLD_GLOBAL)
    monkeypatch.setenv("LIBRARY_PATH", str(fake))  # the link's -lc10_cuda / -ltorch_cuda
    for label, call in (("1_19_ReLU", captured_calls(Path(KB_ANSWERS[0]).read_text())[0]),
                        ("gelu", captured_calls(corpus_answers("cuda", ["L1/18_gelu"])[0].code)[0])):
        functions = split_cuda.applies(call)
        path = split_cuda.build_module(call, functions, trusted, tmp_path / "b")
        assert path is not None, (label, (path or tmp_path).parent.joinpath("link.log"))
        m = split_build.load_module(call["name"], path)
        fn = getattr(m, next(iter(functions)))
        assert m.__name__ == call["name"] and fn.__doc__.startswith(f"{fn.__name__}(arg0: torch.Tensor) -> torch.Tensor")
        if label == "1_19_ReLU":  # the answer's TORCH_CHECK, raised as torch raises it
            with pytest.raises(RuntimeError, match="expected a float32 CUDA tensor"):
                fn(torch.randn(8))
        else:  # no check: the stub launches through the CUDA runtime, which has no device here
            runtime.cudaGetLastError()
            assert fn(torch.randn(8)).shape == (8,)
            assert runtime.cudaGetLastError() != 0  # the launch reached cudart and failed there


def test_a_stub_of_another_type_is_caught_by_its_mangled_name():
    host = {"_Z14sbx_launch_k17sbx_launch_configPf", "_ZN3c104cuda20getCurrentCUDAStreamEa"}
    assert split_cuda.stubs_match(host, {"_Z14sbx_launch_k17sbx_launch_configPf"})
    assert not split_cuda.stubs_match(host, {"_Z14sbx_launch_k17sbx_launch_configPd"})


# --- on a GPU machine (a CUDA torch links and runs the module) -------------------------------------

@pytest.fixture
def hooked(monkeypatch, tmp_path, trusted, cuda_env):
    """``load_inline`` as a compile step wraps it, with the split build's trusted parts ready."""
    monkeypatch.setattr(cpp_extension, "load_inline", inspect.unwrap(cpp_extension.load_inline))
    monkeypatch.setattr(cpp_extension, "load", inspect.unwrap(cpp_extension.load))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    build.install_build_hooks(str(tmp_path), None, [], None, str(trusted), [])
    return cpp_extension.load_inline


def _decision(build_dir: Path, name: str) -> str:
    return json.loads((build_dir / f"{name}.pch.json").read_text())["split_build"]


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="links and runs a CUDA module: needs a GPU and a CUDA "
                         "torch (libc10_cuda, libtorch_cuda); the CPU box compiles the units only (test above)")


def _reference(label: str, x: torch.Tensor) -> tuple[list, torch.Tensor] | None:
    """(arguments, expected) of an L1 KernelBench answer's exported function on ``x``."""
    refs = {"1_19_ReLU": ([], torch.relu(x)), "1_20_LeakyReLU": ([0.01], torch.nn.functional.leaky_relu(x, 0.01)),
            "1_23_Softmax": ([], torch.softmax(x, 1)), "1_47_Sum_reduction_over_a_dimension": ([1], x.sum(1, keepdim=True)),
            "1_88_MinGPTNewGelu": ([], torch.nn.functional.gelu(x, approximate="tanh"))}
    return refs.get(label)


@pytest.mark.gpu
@GPU
def test_kernelbench_and_hand_written_answers_build_split_load_and_are_correct(hooked, tmp_path, trusted):
    x = torch.randn(64, 1000, device="cuda")
    for path in KB_ANSWERS:
        label = Path(path).stem
        call = captured_calls(Path(path).read_text())[0]
        m = hooked(**call)
        assert _decision(tmp_path, call["name"]) == str(trusted), label
        ref = _reference(label, x)
        if ref:
            out = getattr(m, next(iter(split_cuda.applies(call))))(x.clone(), *ref[0])
            torch.testing.assert_close(out, ref[1], rtol=1e-4, atol=1e-5)
    m = hooked(**HAND["macros_two_kernels"])
    torch.testing.assert_close(m.square_plus(x, 0.5), x * x + 0.5)
    with pytest.raises(RuntimeError, match="x must be a CUDA tensor"):
        m.square_plus(x.cpu(), 0.5)
    m = hooked(**HAND["structs_shared"])
    torch.testing.assert_close(m.transpose(x), x.t().contiguous())
    torch.testing.assert_close(m.rowsum(x), x.sum(1), rtol=1e-4, atol=1e-4)
    m = hooked(**HAND["wrapper"])  # main.cpp a unit of its own
    assert torch.equal(m.fill_twice(torch.zeros(32, device="cuda")), torch.ones(32, device="cuda"))
    m = hooked(**HAND["flag_macro"])
    assert torch.equal(m.fill(torch.zeros(32, device="cuda")), torch.ones(32, device="cuda"))
    for name in ("macros_two_kernels", "structs_shared", "wrapper", "flag_macro"):
        assert _decision(tmp_path, name) == str(trusted), name


@pytest.mark.gpu
@GPU
def test_a_fallback_builds_torchs_way_and_the_run_step_repeats_the_split(hooked, tmp_path, trusted):
    call = hand_call("templated", FALLBACKS["templated kernel"], ["relu"], "torch::Tensor relu(torch::Tensor x);")
    m = hooked(**call)
    x = torch.randn(200, device="cuda")
    torch.testing.assert_close(m.relu(x[:256]), torch.relu(x[:256]))
    assert _decision(tmp_path, "templated") == "fallback"
    m = hooked(**HAND["names"])
    assert _decision(tmp_path, "names") == str(trusted)
    so = split_build.module_path(tmp_path, "names")
    before = so.stat().st_mtime_ns
    build.install_build_hooks(str(tmp_path), None, [], None, None, [])  # the run step: the recorded decision
    again = cpp_extension.load_inline(**HAND["names"])
    assert so.stat().st_mtime_ns == before
    t = torch.zeros(32, device="cuda")
    assert torch.equal(again.fill(t), torch.ones(32, device="cuda"))
    assert again.fill.__doc__.startswith("fill(arg0: torch.Tensor) -> torch.Tensor")


@pytest.mark.gpu
@GPU
def test_the_cuda_corpus_scores_as_expected_with_the_split_build(tmp_path):
    from tests.rewards.test_corpus import evaluate_all, verdict

    split_build.build_trusted(tmp_path / "split", [])  # what the pool builds after a flag set's second use
    answers = corpus_answers("cuda")
    workers = max(2, (os.cpu_count() or 4) // 2)
    outcomes = evaluate_all("cuda", answers, "kernel_cuda", cache_dir=str(tmp_path), compile_workers=workers,
                            max_concurrent=16, split_build=True, split_build_cuda=True)
    bad = {(a.task_id, a.variant): (verdict(o), o.feedback[:300]) for a in answers
           for o in [outcomes[(a.task_id, a.variant)]] if verdict(o) != a.expected}
    assert not bad, bad
    decisions = [json.loads(p.read_text())["split_build"] for p in (tmp_path / "builds").rglob("*.pch.json")]
    # every answer that builds took the split path (the broken ones fell back, then failed torch's way)
    assert sum(d == str(tmp_path / "split") for d in decisions) == sum(a.expected != "compile_error" for a in answers)
