"""bench.kernelbench on a tiny fake KernelBench tree, CPU backend: the self-test finds the
references correct against themselves, a broken task file is a row (never a crash), and the
answers mode reports its phases."""
import json
import shutil
from pathlib import Path

import pytest

from bench import kernelbench

FIXTURE_TASKS = Path(__file__).resolve().parent.parent / "fixtures" / "sandbox" / "tasks"
# small, as tests/sandbox/conftest.py keeps them: the suite runs on 2 cores
SMALL = ["precompiled_header=false", "run_timeout_s=20", "compile_timeout_s=400", "warmup_runs=1",
         "timing_runs=5", "correctness_trials=2", "memory_limit_bytes=4294967296", "max_processes=64",
         "max_concurrent=2", "compile_workers=1"]


@pytest.fixture
def kb_root(tmp_path: Path) -> Path:
    level1 = tmp_path / "kb" / "level1"
    level1.mkdir(parents=True)
    shutil.copy(FIXTURE_TASKS / "relu.py", level1 / "1_relu.py")
    shutil.copy(FIXTURE_TASKS / "rowsum.py", level1 / "2_rowsum.py")
    (level1 / "3_broken.py").write_text("import torch\n\nclass Model(:\n    pass\n")
    (level1 / "4_no_inputs.py").write_text("import torch.nn as nn\n\nclass Model(nn.Module):\n    pass\n")
    (level1 / "README.md").write_text("not a task\n")
    return tmp_path / "kb"


def _args(root: Path, out: Path, *extra: str, kernel_cache_dir: str) -> list[str]:
    sets = [a for s in SMALL + [f"cache_dir={kernel_cache_dir}"] for a in ("--set", s)]
    return ["--root", str(root), "--levels", "1", "--backend", "cpu", "--out", str(out), *sets, *extra]


def test_selftest_reports_references_correct_and_lists_broken_files(kb_root, tmp_path, kernel_cache_dir, capsys):
    out = tmp_path / "selftest.json"
    kernelbench.main(_args(kb_root, out, kernel_cache_dir=kernel_cache_dir))
    data = json.loads(out.read_text())
    recs = {r["task"]: r for r in data["records"]}
    assert set(recs) == {"L1/1_relu", "L1/2_rowsum", "L1/3_broken", "L1/4_no_inputs"}
    for task in ("L1/1_relu", "L1/2_rowsum"):
        assert recs[task]["verdict"] == "correct", recs[task]
        assert isinstance(recs[task]["speedup"], float) and recs[task]["speedup"] > 0
        assert recs[task]["input_bytes"] > 0 and recs[task]["output_bytes"] > 0  # measured on meta
        assert recs[task]["wall_s"]["total"] > 0
    assert recs["L1/3_broken"]["verdict"] == "load_failed" and "SyntaxError" in recs["L1/3_broken"]["error"]
    assert recs["L1/4_no_inputs"]["verdict"] == "load_failed" and "get_inputs" in recs["L1/4_no_inputs"]["error"]
    s = data["summary"]
    assert s["correct"] == 2 and s["attempted"] == 4 and s["correct_share_loaded"] == 1.0
    assert s["pool_stats"]["evaluations"] == 2 and s["not_run"] == []
    assert {f["task"] for f in s["failures"]} == {"L1/3_broken", "L1/4_no_inputs"}
    assert data["footprint"]["measured"] == 2 and data["footprint"]["inputs_over_1GB"] == 0
    printed = capsys.readouterr()
    assert "| correct share" in printed.out and "L1/3_broken" in printed.out
    assert "self 2/2" in printed.err  # progress lines as it goes


def test_budget_spent_means_not_run_and_answers_mode(kb_root, tmp_path, kernel_cache_dir):
    # a zero budget launches nothing: every loadable task is listed as not run, nothing crashes
    out = tmp_path / "budget.json"
    kernelbench.main(_args(kb_root, out, "--budget-s", "1e-9", "--tasks", "*_r*", kernel_cache_dir=kernel_cache_dir))
    s = json.loads(out.read_text())["summary"]
    assert sorted(s["not_run"]) == ["L1/1_relu", "L1/2_rowsum"] and s["attempted"] == 0

    # answers mode with a plain-torch answer (the CUDA ones need a GPU): a cold phase and a cached one
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "1_1_relu.py").write_text(
        "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return x.clamp_min(0)\n")
    (answers / "1_9_missing.py").write_text("class ModelNew: pass\n")
    out = tmp_path / "answers.json"
    kernelbench.main(_args(kb_root, out, "--answers", str(answers), kernel_cache_dir=kernel_cache_dir))
    data = json.loads(out.read_text())
    rows = {r["phase"]: r for r in data["summary"]["rows"]}
    assert set(rows) == {"cold", "cached1"}
    assert rows["cold"]["evals"] == rows["cold"]["correct"] == 1 and rows["cached1"]["correct"] == 1
    assert [f["task"] for f in data["summary"]["failures"]] == ["L1/9_missing"]


def test_answers_per_task_launches_a_group_of_distinct_answers_to_each_task(kb_root, tmp_path, kernel_cache_dir):
    """--answers-per-task 3: three distinct answers (sources differ, so no build or verdict is
    shared) to each task, evaluated together under the host's gate; with one reference sample the
    reference is timed by at most one of them (the others learn its time from the gate), but for an
    answer that looks faster than that time (it has the reference timed beside it)."""
    out = tmp_path / "group.json"
    kernelbench.main(_args(kb_root, out, "--answers-per-task", "3", "--tasks", "1_relu*", "--set", "cpu_run_slots=3",
                           "--set", "max_concurrent=3", "--set", "reference_samples=1",
                           kernel_cache_dir=kernel_cache_dir))
    data = json.loads(out.read_text())
    recs = {r["task"]: r for r in data["records"]}
    assert set(recs) == {"L1/1_relu#0", "L1/1_relu#1", "L1/1_relu#2"}
    assert all(r["verdict"] == "correct" and not r["cache_hit"] for r in recs.values()), recs
    learned = [r for r in recs.values() if "ref_known_ms" not in r["wall_s"]]
    assert sum("ref_timing" in r["wall_s"] for r in learned) <= 1, recs
    # an answer that learned the time uses one some step of the group measured: the first sample's,
    # or a faster one that an answer looking faster than it measured beside itself (it replaces it)
    measured = {r["ref_ms"] for r in recs.values() if "ref_timing" in r["wall_s"]}
    assert all(r["ref_ms"] in measured for r in learned), recs
    assert len({r["ref_ms"] for r in learned}) == 1 or any("ref_known_ms" in r["wall_s"] for r in recs.values()), recs
    assert data["summary"]["pool_stats"]["evaluations"] == 3


def test_device_use_splits_the_span_into_exclusive_windows_and_shared_sections():
    """Two steps over 10 s: windows of 2 s and 3 s (half the span), shared sections of 4 s and 6 s in
    the other 5 s (two at once on average)."""
    recs = [{"t_start_s": 0.0, "t_end_s": 6.0, "wall_s": {"device_exclusive": 2.0, "device_shared": 4.0}},
            {"t_start_s": 1.0, "t_end_s": 10.0, "wall_s": {"device_exclusive": 3.0, "device_shared": 6.0}}]
    use = kernelbench.device_use(recs)
    assert use == {"span_s": 10.0, "exclusive_share": 0.5, "shared_concurrency": 2.0, "exclusive_s_per_eval": 2.5}
    assert kernelbench.device_use([]) == {}
