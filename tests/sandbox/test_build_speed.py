"""The small form of ``python -m bench.build_speed`` (docs/sandbox.md, "Where a cold build's time
goes"): the fast tests check what the bench's figures rest on without building torch's header
(seconds on 2 cores); the slow one is the bench itself with one answer and all three variants."""
import json
import shutil
import subprocess
import sys

import pytest

from bench import build_speed
from sandbox import build

CXX = shutil.which("c++") or shutil.which("g++")
FLAGS = ["-O3", "-ffast-math", "-march=native", "-fopenmp"]


def test_distinct_answers_are_distinct_builds_with_one_pch_flag_set():
    answers = build_speed.templates(FLAGS)
    assert answers and all(flags == FLAGS for _, _, flags in answers)
    assert build.pch_allowed(FLAGS)  # the sandbox variant gets a PCH for every one of them
    task, src, _ = answers[0]
    variants = [build_speed.distinct(src, k, "n") for k in range(3)]
    keys = {build.build_key(v, "cpu", "", "t") for v in variants}
    assert len(keys) == 3 and all("kBenchVariant_" in v for v in variants), task


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_the_pch_dir_layout_makes_gxx_use_the_gch_for_both_includes(tmp_path):
    """What the sandbox's PCH saves only holds if g++ takes the .gch: the first #include of
    torch/extension.h from the PCH dir, the second (the answer's own) through the forwarder.
    A stand-in header keeps it to a second; -H marks a used PCH with '!'."""
    real = tmp_path / "real" / "torch"
    real.mkdir(parents=True)
    (real / "extension.h").write_text("#pragma once\ninline int stand_in() { return 1; }\n")
    pch = tmp_path / "pch" / "torch"
    pch.mkdir(parents=True)
    flags = ["-fPIC", "-std=c++20", *FLAGS]
    subprocess.run([CXX, "-x", "c++-header", str(real / "extension.h"), "-o", str(pch / "extension.h.gch"), *flags],
                   check=True, capture_output=True)
    (pch / "extension.h").write_text(build.PCH_FORWARDER)
    main = tmp_path / "main.cpp"
    main.write_text("#include <torch/extension.h>\n#include <torch/extension.h>\nint f() { return stand_in(); }\n")
    out = subprocess.run([CXX, f"-I{tmp_path / 'pch'}", "-isystem", str(tmp_path / "real"), *flags, "-H",
                          "-Winvalid-pch", "-c", str(main), "-o", str(tmp_path / "main.o")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"! {pch / 'extension.h.gch'}" in out.stderr, out.stderr


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_time_report_reads_gxx_phases(tmp_path):
    src = tmp_path / "t.cpp"
    src.write_text("#include <vector>\nint f() { std::vector<int> v(3); return v.size(); }\n")
    rep = build_speed.time_report([CXX, "-O2"], src)
    assert rep["ok"] and rep["TOTAL"]["user_s"] >= 0 and "phase opt and generate" in rep


def test_ninja_times_split_compile_and_link(tmp_path):
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / ".ninja_log").write_text("# ninja log v7\n0\t1500\t1\tmain.o\th\n1500\t1800\t1\tx.so\th\n")
    assert build_speed.ninja_times(tmp_path) == {"compile_s": 1.5, "link_s": 0.3}


@pytest.mark.slow
@pytest.mark.timeout(2400)  # with split_cache's trusted builds when this is the first test to ask for them
def test_the_sandbox_and_split_builds_beat_plain_load_inline(tmp_path, kernel_cache_dir, split_cache):
    """One answer built plain, through the sandbox (PCH) and split, in one run: plain is built once
    and both ratios are to that build. The PCH and the split build's trusted parts come from the
    session's caches (the same flags: tests/rewards/test_corpus.py builds this PCH, the split_cache
    fixture these trusted parts; the bench builds whichever is missing). CPU seconds, not wall: the
    box is shared."""
    out = tmp_path / "b.json"
    subprocess.run([sys.executable, "-m", "bench.build_speed", "--n", "1", "--variants", "plain,sandbox,split",
                    "--pch-root", f"{kernel_cache_dir}/pch", "--split-root", str(split_cache / "split"),
                    "--out", str(out)], check=True, timeout=1800)
    res = json.loads(out.read_text())
    assert [r["variant"] for r in res["rows"]] == ["plain", "sandbox", "split"], res["rows"]
    assert all(r["builds"] == 1 for r in res["rows"]), res["rows"]
    assert res["pch_used"] and res["split_used"], res["runs"]
    assert res["cpu_ratio_p50"] < 1.0, res["rows"]
    assert res["split_cpu_ratio_p50"] < 0.3, res["rows"]  # the split build's bar: 0.3x plain
