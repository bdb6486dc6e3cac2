"""The split C++ build (sandbox/split_build.py) with real g++ builds: the trusted library and the
``min`` header's PCHs are built once for the session (``split_cache``, tests/sandbox/conftest.py);
then the corpus's C++ answers through the pool (compile step and run step), a module's behaviour
against torch's, a fallback, and hostile answers that define the trusted library's symbols."""
import asyncio
import dataclasses
import inspect
import json

import pytest
import torch
from torch.utils import cpp_extension

from bench.build_speed import templates
from sandbox import build, split_build
from sandbox.pool import SandboxPool

FLAGS = ["-O3", "-fopenmp"]  # one of the corpus's flag sets: split_cache has its trusted parts
# the session's first test to ask for split_cache waits for the trusted builds (~420 s at load ~30
# on the 2-core box)
pytestmark = pytest.mark.timeout(2400)


@pytest.fixture
def hooked(monkeypatch, tmp_path, split_cache):
    """``load_inline`` as a compile step wraps it, with the split build on (restored afterwards)."""
    assert split_build.ready(split_cache / "split", FLAGS)  # else every build here would fall back
    monkeypatch.setattr(cpp_extension, "load_inline", inspect.unwrap(cpp_extension.load_inline))
    monkeypatch.setattr(cpp_extension, "load", inspect.unwrap(cpp_extension.load))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    build.install_build_hooks(str(tmp_path), None, [], None, str(split_cache / "split"), [])
    return cpp_extension.load_inline


def _decision(build_dir, name):
    return json.loads((build_dir / f"{name}.pch.json").read_text())


async def test_the_corpus_cpp_answers_build_split_and_are_correct(split_cache, sandbox_cfg):
    from rewards.tasks.loader import load_builtin

    answers = templates()
    assert len(answers) >= 10
    tasks = {t.id: t for t in load_builtin(profile="cpu")}
    cfg = dataclasses.replace(sandbox_cfg, split_build=True, cache_dir=str(split_cache))
    async with SandboxPool(cfg) as pool:
        results = await asyncio.gather(*(pool.evaluate(tasks[task].source, src, "cpu") for task, src, _ in answers))
    bad = [(task, r.error_kind, r.error) for (task, _, _), r in zip(answers, results) if not r.correct]
    assert not bad
    decisions = [json.loads(p.read_text()) for p in (split_cache / "builds").rglob("*.pch.json")]
    assert len(decisions) == len(answers)
    assert {d["split_build"] for d in decisions} == {str(split_cache / "split")}


def test_a_split_module_behaves_as_torchs(hooked, tmp_path, split_cache):
    src = ('#include <torch/extension.h>\n'
           'torch::Tensor scaled(const torch::Tensor& x, double s) {\n'
           '  TORCH_CHECK(x.dim() == 1, "scaled wants a 1-d tensor, got ", x.dim());\n'
           '  return x * s;\n}\n'
           'torch::Tensor twice(torch::Tensor x) { return x + x; }\n')
    m = hooked(name="split_behaviour", cpp_sources=src, functions={"scaled": "x times s", "twice": "x + x"},
               extra_cflags=FLAGS)
    assert _decision(tmp_path, "split_behaviour")["split_build"] == str(split_cache / "split")
    assert m.__name__ == "split_behaviour" and m.__file__.endswith("split_behaviour.so")
    x = torch.arange(4.0)
    assert torch.equal(m.scaled(x, 2.5), x * 2.5) and torch.equal(m.twice(x), x + x)
    # pybind11's own signature line (its spelling of double varies by version), then the docstring given
    assert m.scaled.__doc__.startswith("scaled(arg0: torch.Tensor, arg1: ") and "x times s" in m.scaled.__doc__
    assert m.twice.__doc__.startswith("twice(arg0: torch.Tensor) -> torch.Tensor")
    with pytest.raises(RuntimeError, match="scaled wants a 1-d tensor, got 2"):
        m.scaled(torch.zeros(2, 2), 1.0)
    with pytest.raises(TypeError):
        m.twice("not a tensor")
    # the run step: a fresh wrapper repeats the recorded split build, which is up to date (no compile)
    so = split_build.module_path(tmp_path, "split_behaviour")
    before = so.stat().st_mtime_ns
    build.install_build_hooks(str(tmp_path), None, [], None, None, [])
    again = cpp_extension.load_inline(name="split_behaviour", cpp_sources=src,
                                      functions={"scaled": "x times s", "twice": "x + x"}, extra_cflags=FLAGS)
    assert so.stat().st_mtime_ns == before and torch.equal(again.twice(x), x + x)


@pytest.mark.parametrize("hostile", [
    'extern "C" void* sbx_make_module(const char*, int, const char* const*, const char* const*, void* const*,\n'
    '                                 void (*const*)(void*, const char*, const char*, void*)) { return nullptr; }\n',
    'extern "C" void sbx_bind_T_T(void*, const char*, const char*, void*) {}\n',
    'extern "C" int sbx_anything = 1;\n',
])
def test_an_answer_that_defines_the_trusted_librarys_symbols_fails_the_build(hooked, tmp_path, hostile):
    src = "#include <torch/extension.h>\n" + hostile + "torch::Tensor f(torch::Tensor x) { return x; }\n"
    with pytest.raises(split_build.ReservedSymbol, match="Error building extension 'hostile'.*reserved symbol"):
        hooked(name="hostile", cpp_sources=src, functions=["f"], extra_cflags=FLAGS)
    assert not split_build.module_path(tmp_path, "hostile").exists()
    assert not (tmp_path / "hostile.pch.json").exists()  # nothing recorded: no build of it to repeat


def test_a_signature_without_a_binder_is_built_the_old_way_and_recorded(hooked, tmp_path):
    src = ("#include <torch/extension.h>\n"
           "std::vector<torch::Tensor> halves(torch::Tensor x) { return {x / 2, x - x / 2}; }\n")
    m = hooked(name="split_fallback", cpp_sources=src, functions=["halves"], extra_cflags=FLAGS)
    a, b = m.halves(torch.ones(3))
    assert torch.equal(a + b, torch.ones(3))
    assert _decision(tmp_path, "split_fallback")["split_build"] == "fallback"
    assert not split_build.module_path(tmp_path, "split_fallback").exists()


def test_calls_the_split_build_does_not_take():
    assert split_build.applies({"name": "e", "functions": ["f"], "extra_cflags": FLAGS}) == {"f": "f"}
    for change in ({"cuda_sources": "x"}, {"functions": None}, {"extra_cflags": ["-O1"]}, {"functions": ["f(x)"]},
                   {"with_pytorch_error_handling": False}, {"name": "a-b"}, {"extra_include_paths": ["/x"]}):
        assert split_build.applies({"name": "e", "functions": ["f"], "extra_cflags": FLAGS, **change}) is None, change


async def test_the_pool_builds_the_trusted_parts_on_a_flag_sets_second_use_only_once(sandbox_cfg, tmp_path,
                                                                                      monkeypatch):
    cfg = dataclasses.replace(sandbox_cfg, split_build=True, pch_min_builds=2, cache_dir=str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # the builder's compiler fails at once: what is under test is the schedule
    async with SandboxPool(cfg) as pool:
        pool._builds.schedule_split(FLAGS)
        assert not pool._builds.pch_building
        pool._builds.schedule_split(FLAGS)
        pool._builds.schedule_split(FLAGS)
        assert len(pool._builds.pch_building) == 1
        await pool._builds.headers_ready()
        assert pool.stats().get("split_failed") == 1.0
        for _ in range(3):
            pool._builds.schedule_split(["-fno-such-flag-for-this-test"])
        assert len(pool._builds.pch_building) == 1
