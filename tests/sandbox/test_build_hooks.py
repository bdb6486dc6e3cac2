"""The load_inline wrapper's decisions (narrow CUDA header, fallback, repeat in the run step).

The compiler itself is exercised elsewhere (tests/rewards/test_cuda_compile.py builds every CUDA
solution with nvcc through the narrow header; the pool tests build C++ for real). Here a recorder
takes torch's place, because what is under test is which builds the wrapper asks for.
"""
import inspect
import json

import pytest
from torch.utils import cpp_extension

from sandbox import build


@pytest.fixture
def recorder(monkeypatch):
    calls, fail_when = [], []

    def load_inline(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None,
                    extra_cuda_cflags=None, extra_ldflags=None, extra_include_paths=None, **rest):
        call = {"name": name, "cuda_sources": cuda_sources, "extra_cuda_cflags": list(extra_cuda_cflags or []),
                "extra_include_paths": list(extra_include_paths or [])}
        calls.append(call)
        if any(f(call) for f in fail_when):
            raise RuntimeError(f"Error building extension '{name}'")
        return call

    monkeypatch.setattr(cpp_extension, "load_inline", load_inline)
    return calls, fail_when


def _hooked(tmp_path, narrow=True):
    """A fresh process's wrapper: around the recorder, not around an earlier wrapper."""
    cpp_extension.load_inline = inspect.unwrap(cpp_extension.load_inline)
    build.install_build_hooks(str(tmp_path / "b"), None, [], str(tmp_path / "n") if narrow else None)
    return cpp_extension.load_inline


@pytest.fixture
def dirs(tmp_path):
    (tmp_path / "b").mkdir()
    build.write_narrow_header(tmp_path / "n")
    return tmp_path


CU = "__global__ void k(float* x) { x[0] = 1.f; }\ntorch::Tensor f(torch::Tensor x) { return x; }"


def test_narrow_header_dir_comes_first_and_the_run_step_repeats_the_same_build(recorder, dirs):
    calls, _ = recorder
    _hooked(dirs)("ext", "torch::Tensor f(torch::Tensor x);", cuda_sources=CU, functions=["f"],
                  extra_cuda_cflags=["-O3"])
    assert calls[-1]["extra_cuda_cflags"] == [f"-I{dirs / 'n' / 'min'}", "-O3"] and calls[-1]["name"] == "ext"
    assert (dirs / "n" / "min" / "torch" / "extension.h").read_text() == build.NARROW_EXTENSION_H
    assert (dirs / "n" / "min" / "torch" / "types.h").read_text() == build.MIN_TYPES_H
    assert not (dirs / "n" / "types" / "torch" / "types.h").exists()  # that tier is torch's own types.h
    decision = json.loads((dirs / "b" / "ext.pch.json").read_text())
    assert decision["narrow_cuda_header"] == str(dirs / "n" / "min")
    first = calls[-1]
    # the run step: a fresh wrapper reading the decision file, even without the dir passed again
    _hooked(dirs, narrow=False)("ext", "torch::Tensor f(torch::Tensor x);", cuda_sources=CU, functions=["f"],
                                extra_cuda_cflags=["-O3"])
    assert calls[-1] == first


def test_a_build_the_narrow_header_cannot_satisfy_is_built_as_written_under_its_own_name(recorder, dirs):
    calls, fail_when = recorder
    fail_when.append(lambda c: any(f.startswith("-I") for f in c["extra_cuda_cflags"]))
    out = _hooked(dirs)("ext", "", cuda_sources=CU, extra_cuda_cflags=["-O3"])
    assert [c["name"] for c in calls] == ["ext", "ext_typeshdr", "ext" + build.FULL_HEADER_SUFFIX]
    assert calls[1]["extra_cuda_cflags"] == [f"-I{dirs / 'n' / 'types'}", "-O3"]
    assert out["extra_cuda_cflags"] == ["-O3"]
    n = len(calls)
    _hooked(dirs)("ext", "", cuda_sources=CU, extra_cuda_cflags=["-O3"])
    assert len(calls) == n + 1 and calls[-1] == calls[n - 1]  # straight to the full-header build


def test_a_build_the_min_tier_cannot_satisfy_gets_torch_types_h_and_keeps_it(recorder, dirs):
    calls, fail_when = recorder
    fail_when.append(lambda c: f"-I{dirs / 'n' / 'min'}" in c["extra_cuda_cflags"])
    out = _hooked(dirs)("ext", "", cuda_sources=CU)
    assert [c["name"] for c in calls] == ["ext", "ext_typeshdr"]
    assert out["extra_cuda_cflags"] == [f"-I{dirs / 'n' / 'types'}"]
    _hooked(dirs, narrow=False)("ext", "", cuda_sources=CU)
    assert calls[-1] == calls[1]  # the run step repeats the build that worked


def test_a_failure_after_the_cu_compiled_is_not_retried(recorder, dirs, monkeypatch):
    """A link or main.cpp error is the answer's, not the narrow header's: one build, its error."""
    calls, fail_when = recorder
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(dirs / "ext"))

    def link_fails(call):
        obj = dirs / "ext" / call["name"] / "cuda.cuda.o"
        obj.parent.mkdir(parents=True, exist_ok=True)
        obj.write_bytes(b"\x7fELF")  # nvcc's object is there; the link is what failed
        return True

    fail_when.append(link_fails)
    with pytest.raises(RuntimeError, match="'ext'"):
        _hooked(dirs)("ext", "", cuda_sources=CU)
    assert len(calls) == 1


def test_a_genuine_error_is_the_real_headers_error(recorder, dirs):
    calls, fail_when = recorder
    fail_when.append(lambda c: True)
    with pytest.raises(RuntimeError, match="ext" + build.FULL_HEADER_SUFFIX):
        _hooked(dirs)("ext", "", cuda_sources="this is not CUDA")
    assert len(calls) == 3


@pytest.mark.parametrize("text", ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}", "torch::nn::Linear l(1, 1);"])
def test_sources_that_need_the_full_header_skip_the_narrow_attempt(recorder, dirs, text):
    calls, _ = recorder
    _hooked(dirs)("ext", "", cuda_sources=[CU, text])
    assert len(calls) == 1 and calls[0]["extra_cuda_cflags"] == [] and calls[0]["name"] == "ext"


def test_cpp_only_builds_and_a_disabled_narrow_header_are_untouched(recorder, dirs):
    calls, _ = recorder
    _hooked(dirs)("cpu_ext", "int f() { return 1; }", functions=["f"])
    _hooked(dirs, narrow=False)("cuda_ext", "", cuda_sources=CU)
    assert [(c["name"], c["extra_cuda_cflags"]) for c in calls] == [("cpu_ext", []), ("cuda_ext", [])]


@pytest.mark.parametrize("kw", [{"extra_cflags": ["-wrapper", "/bin/sh,x"]}, {"extra_cflags": ["-O3 -B/tmp"]},
                                {"extra_cuda_cflags": ["-ccbin", "/tmp/cc"]}, {"extra_ldflags": ["-Wl,-rpath,/tmp"]},
                                {"extra_include_paths": ["/root"]}, {"build_directory": "/tmp/x"},
                                {"extra_cflags": ["@/etc/passwd"]}])
def test_a_disallowed_build_argument_is_refused_before_any_build(recorder, dirs, kw):
    calls, _ = recorder
    with pytest.raises(RuntimeError, match="^disallowed build argument: "):
        _hooked(dirs)("ext", "", cuda_sources=CU, **kw)
    with pytest.raises(RuntimeError, match="^disallowed build argument: "):  # positional arguments too
        _hooked(dirs)("ext", "", CU, None, kw.get("extra_cflags"), kw.get("extra_cuda_cflags"), kw.get("extra_ldflags"),
                      kw.get("extra_include_paths"), **{k: v for k, v in kw.items() if k == "build_directory"})
    assert calls == [] and not list((dirs / "b").iterdir())


def test_allowed_flags_pass_through_as_plain_copies(recorder, dirs):
    calls, _ = recorder
    flags = ("-O3", "--use_fast_math", "-Xptxas", "-v")
    _hooked(dirs, narrow=False)("ext", "", cuda_sources=CU, extra_cuda_cflags=flags)
    assert calls[-1]["extra_cuda_cflags"] == list(flags)


def test_load_is_checked_too(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(cpp_extension, "load", lambda name, sources, extra_cflags=None, **kw: seen.append(extra_cflags))
    _hooked(tmp_path)
    with pytest.raises(RuntimeError, match="^disallowed build argument: .*-fplugin"):
        cpp_extension.load("ext", ["a.cpp"], extra_cflags=["-fplugin=/tmp/p.so"])
    cpp_extension.load("ext", ["a.cpp"], extra_cflags=["-O3"])
    assert seen == [["-O3"]]
