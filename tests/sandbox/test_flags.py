"""The compiler/linker argument allowlist of load_inline / load calls (sandbox.flags)."""
import pytest

from sandbox.flags import check_build_call


@pytest.mark.parametrize("flags", [
    [], [""], ["-O3"], ["-O0"], ["-Os"], ["-Ofast"], ["-O3", "-fopenmp"], ["-O3", "-ffast-math", "-march=native"],
    ["-funroll-loops", "-fno-math-errno", "-mavx2", "-mfma", "-mavx512f", "-mtune=native", "-march=znver3"],
    ["-std=c++17", "-fPIC", "-g0", "-w", "-Wall", "-Wextra", "-Wno-unused-variable"],
    ["-DBLOCK=256", "-DUSE_FAST", "-DSCALE=1.5f", "-DNEG=-1", "-UNDEBUG", "-U__CUDA_NO_HALF_OPERATORS__"],
])
def test_allowed_gxx_flags(flags):
    assert check_build_call({"name": "ext", "extra_cflags": flags}) == []


@pytest.mark.parametrize("flags", [
    ["-O3", "--use_fast_math"], ["-use_fast_math"], ["-arch=sm_90"], ["-arch=sm_90a"], ["-arch", "sm_80"],
    ["-gencode=arch=compute_90,code=sm_90"], ["-gencode", "arch=compute_80,code=sm_80"],
    ["--generate-code=arch=compute_90a,code=[sm_90a,compute_90a]"],
    ["--expt-relaxed-constexpr", "--expt-extended-lambda", "-lineinfo", "-res-usage", "-std=c++17"],
    ["--ptxas-options=-v"], ["--ptxas-options=-O3"], ["-Xptxas=-O3"], ["-Xptxas", "-v"], ["-Xptxas=-v,-O3"],
    ["--maxrregcount=64"], ["--extra-device-vectorization"], ["-DTILE=32"],
    ["-Xcompiler=-fopenmp"], ["-Xcompiler", "-fopenmp"], ["-Xcompiler", "-O3,-fPIC"], ["--compiler-options", "-fPIC"],
])
def test_allowed_nvcc_flags(flags):
    assert check_build_call({"name": "ext", "extra_cuda_cflags": flags, "with_cuda": True, "verbose": True}) == []


@pytest.mark.parametrize("flags", [[], [""], ["-lcublas"], ["-lcublasLt", "-lcudart", "-lcuda"], ["-fopenmp"],
                                   ["-lgomp", "-lm", "-lpthread", "-lcurand", "-lcufft", "-lcusparse", "-lcusolver"]])
def test_allowed_ldflags(flags):
    assert check_build_call({"name": "ext", "extra_ldflags": flags}) == []


@pytest.mark.parametrize("flags", [
    ["-wrapper", "/bin/sh,x"], ["-wrapper /bin/sh,x"], ["-B/tmp"], ["-specs=/tmp/x"], ["-fplugin=/tmp/p.so"],
    ["-include", "/root/.netrc"], ["-include/root/.netrc"], ["-imacros", "x.h"], ["-I/tmp"], ["-isystem", "/x"],
    ["-L/tmp"], ["-Wl,-rpath,/tmp"], ["-Xlinker", "-rpath"], ["@/etc/passwd"], ["-o", "/tmp/x"], ["-x", "c"],
    ["-fdump-tree-all"], ["-save-temps"], ["-Werror"], ["-O3 -wrapper /bin/sh,x"], ["-DX=\"a\""], ["-DX=a/b"],
    ["-DX=1 -DY"], ["-Wa,-adhln"], ["-Wp,-MD,/tmp/x"], ["-march=/tmp"], ["-DX=$(id)"], ["-O3\n"],
])
def test_refused_gxx_flags(flags):
    problems = check_build_call({"name": "ext", "extra_cflags": flags})
    assert problems and all(p.startswith("extra_cflags:") for p in problems), problems


@pytest.mark.parametrize("flags", [
    ["-ccbin", "/tmp/cc"], ["-ccbin=/tmp/cc"], ["--compiler-bindir=/tmp"], ["--keep"], ["--keep-dir=/tmp"],
    ["-Xcompiler", "-wrapper,/bin/sh,x"], ["-Xcompiler=-wrapper,/bin/sh,x"], ["-Xcompiler", "-include/etc/passwd"],
    ["-Xcompiler"], ["-Xptxas", "--output-file=/tmp/x"], ["-Xptxas"], ["-arch", "/tmp"], ["-Xlinker", "-rpath"],
    ["--default-stream=per-thread"], ["-G"], ["-I/tmp"], ["--options-file", "/tmp/o"], ["-optf=/tmp/o"],
    ["-save-temps"], ["--pre-include=/x.h"], ["-Xnvlink", "x"], ["-gencode", "arch=compute_90,code=sm_90 -ccbin=x"],
])
def test_refused_nvcc_flags(flags):
    problems = check_build_call({"name": "ext", "extra_cuda_cflags": flags})
    assert problems and all(p.startswith("extra_cuda_cflags:") for p in problems), problems


@pytest.mark.parametrize("flags", [["-L/tmp"], ["-Wl,-rpath,/tmp"], ["-Xlinker", "--script=/tmp/x"], ["-lssl"],
                                   ["/tmp/evil.so"], ["-l/tmp/x"], ["@/etc/passwd"], ["-shared"], ["-T", "x.ld"]])
def test_refused_ldflags(flags):
    assert check_build_call({"name": "ext", "extra_ldflags": flags})


def test_problems_name_the_flag_and_why():
    (p,) = check_build_call({"extra_cflags": ["-O3", "-wrapper"]})
    assert "'-wrapper'" in p and "another program" in p
    probs = check_build_call({"extra_cflags": ["@/etc/passwd"], "extra_ldflags": ["-Wl,-rpath,/x"]})
    assert any("'@/etc/passwd'" in p and "response file" in p for p in probs)
    assert any(p.startswith("extra_ldflags:") and "-Wl,-rpath" in p for p in probs)
    (p,) = check_build_call({"extra_cuda_cflags": ["-Xcompiler", "-wrapper,/bin/sh,x"]})
    assert "-Xcompiler" in p and "g++" in p


@pytest.mark.parametrize("value", [["-O3", 3], [b"-O3"], "-O3", {"-O3": 1}, [["-O3"]], [None]])
def test_non_string_flags_are_refused(value):
    assert check_build_call({"extra_cflags": value})


def test_str_and_list_subclasses_are_refused():
    class Sneaky(str):
        pass

    class SneakyList(list):
        pass

    assert check_build_call({"extra_cflags": [Sneaky("-O3")]})
    assert check_build_call({"extra_cflags": SneakyList(["-O3"])})


@pytest.mark.parametrize("kw", [{"extra_include_paths": ["/root"]}, {"build_directory": "/tmp/b"},
                                {"build_directory": ""}, {"extra_sycl_cflags": ["-O3"]}, {"name": "x -wrapper y"},
                                {"name": "../x"}, {"name": 3}])
def test_denied_arguments_and_bad_names(kw):
    problems = check_build_call({"name": "ext", **kw})
    assert problems and any(next(iter(kw)) in p for p in problems)


def test_absent_or_empty_denied_arguments_and_other_arguments_pass():
    assert check_build_call({"name": "relu_cpu", "cpp_sources": "int f();", "functions": ["f"],
                             "extra_include_paths": None, "build_directory": None, "extra_cflags": None,
                             "with_cuda": False, "verbose": False, "is_python_module": True}) == []
    assert check_build_call({"name": "ext", "extra_include_paths": []}) == []


@pytest.mark.parametrize("kind,error,log_tail,flagged", [
    ("compile_error", "RuntimeError: disallowed build argument: extra_cflags: '-wrapper' ...", "", True),
    ("load_error", "RuntimeError: the import failed", "... disallowed build argument: name ...", True),
    ("runtime_error", "RuntimeError: disallowed build argument: extra_ldflags: '-L/x' ...", "", True),
    ("compile_error", "error: expected ';'", "", False),             # any other build failure
    ("wrong_output", "disallowed build argument (printed)", "", False),  # not a failed build
    (None, None, "disallowed build argument", False),
])
def test_the_pool_flags_a_build_the_hook_refused(kind, error, log_tail, flagged):
    from sandbox.result import REFUSED_BUILD, SandboxResult, mark_refused_build

    res = mark_refused_build(SandboxResult(error_kind=kind, error=error, log_tail=log_tail, flags=["x"]))
    assert res.error_kind == kind  # the sandbox's own verdict is unchanged; rewards reads the flag
    assert res.flags == (["x", REFUSED_BUILD] if flagged else ["x"])
    assert mark_refused_build(res).flags == res.flags  # once
