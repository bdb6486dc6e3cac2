import ast
import time
import types

import pytest

from rewards.tasks import (Task, TaskError, apply_profile, check_reference, load_builtin, load_kernelbench,
                           load_task_file, split)

TASK = '''import torch
import torch.nn as nn

N = 1024
CPU_SIZES = {{"N": 8}}


class Model(nn.Module):
    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
'''


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def checkout(tmp_path):
    """A KernelBench-style tree: ids 1, 2, 10 (so lexical order differs from numeric) and level 2."""
    for name in ("10_Ten.py", "2_Two.py", "1_One.py"):
        write(tmp_path, f"level1/{name}", TASK.format(expr="torch.relu(x)"))
    write(tmp_path, "level2/3_Fused.py", TASK.format(expr="torch.relu(x) * 2"))
    write(tmp_path, "level1/__init__.py", "")
    write(tmp_path, "level1/README.md", "not a task")
    return tmp_path


def test_builtin_set_is_large_and_covers_both_levels():
    tasks = load_builtin()
    assert len(tasks) >= 40
    assert {t.level for t in tasks} == {1, 2}
    assert sum(t.level == 2 for t in tasks) >= 10
    ids = [t.id for t in tasks]
    assert len(set(ids)) == len(ids) and "L1/12_softmax" in ids


def test_every_builtin_task_runs_on_cpu_quickly():
    slowest = 0.0
    for task in load_builtin(profile="cpu"):
        start = time.perf_counter()
        out = check_reference(task)
        slowest = max(slowest, time.perf_counter() - start)
        outs = out if isinstance(out, tuple) else (out,)
        assert all(o.isfinite().all() for o in outs if o.is_floating_point()), task.id
    assert slowest < 1.0


def test_full_profile_keeps_h200_sizes_and_cpu_profile_is_a_standalone_file():
    full = {t.id: t for t in load_builtin(profile="full")}
    cpu = {t.id: t for t in load_builtin(profile="cpu")}
    relu_full, relu_cpu = full["L1/17_relu"], cpu["L1/17_relu"]
    for t in (relu_full, relu_cpu):
        assert "CPU_SIZES" not in t.source  # loader metadata never reaches the model
        ast.parse(t.source)
    ns_full, ns_cpu = types.SimpleNamespace(), types.SimpleNamespace()
    exec(relu_full.source, ns_full.__dict__)
    exec(relu_cpu.source, ns_cpu.__dict__)
    assert ns_full.BATCH * ns_full.DIM >= 16 * 2**20  # elementwise tasks: >= 16M elements on the GPU
    assert ns_cpu.BATCH * ns_cpu.DIM < 10_000
    gemm = types.SimpleNamespace()
    exec(full["L1/1_square_matmul"].source, gemm.__dict__)
    assert gemm.N == 4096


def test_kernelbench_loader_sorts_by_integer_id_and_names_tasks(checkout):
    tasks = load_kernelbench(checkout, levels=[1])
    assert [t.problem_id for t in tasks] == [1, 2, 10]
    assert [t.id for t in tasks] == ["L1/1_One", "L1/2_Two", "L1/10_Ten"]
    assert tasks[0].name == "One" and tasks[0].level == 1 and tasks[0].path.endswith("1_One.py")
    assert [t.level for t in load_kernelbench(checkout, levels=[1, 2])] == [1, 1, 1, 2]
    assert [t.id for t in load_kernelbench(checkout, levels=[2])] == ["L2/3_Fused"]


def test_kernelbench_repo_layout_is_accepted(tmp_path):
    write(tmp_path, "KernelBench/level1/1_One.py", TASK.format(expr="x"))
    assert [t.id for t in load_kernelbench(tmp_path, levels=[1])] == ["L1/1_One"]


def test_profile_rewrites_sizes(checkout):
    (task,) = [t for t in load_kernelbench(checkout, [1], profile="cpu") if t.problem_id == 1]
    assert "N = 8" in task.source and "N = 1024" not in task.source
    assert check_reference(task).shape == (8,)
    with pytest.raises(TaskError, match="profile"):
        apply_profile(task.source, "x.py", "huge")


def test_cpu_profile_warns_about_files_without_cpu_sizes(tmp_path, caplog):
    write(tmp_path, "level1/1_Plain.py", TASK.format(expr="x").replace('CPU_SIZES = {"N": 8}\n', ""))
    (task,) = load_kernelbench(tmp_path, [1], profile="cpu")
    assert "N = 1024" in task.source and "declare no CPU_SIZES" in caplog.text


def test_missing_level_and_root_are_errors_naming_them(checkout, tmp_path):
    with pytest.raises(TaskError, match="level3"):
        load_kernelbench(checkout, levels=[3])
    with pytest.raises(TaskError, match="not a directory"):
        load_kernelbench(tmp_path / "nope")


@pytest.mark.parametrize("text,expected", [
    ("def broken(:\n", "not valid Python"),
    (TASK.format(expr="x").replace("def get_inputs", "def other_inputs"), "get_inputs"),
    (TASK.format(expr="x").replace("class Model", "class Thing"), "class Model"),
    (TASK.format(expr="x").replace('{"N": 8}', '{"M": 8}'), "CPU_SIZES"),
])
def test_bad_task_files_raise_task_error_naming_file(checkout, text, expected):
    bad = write(checkout, "level1/5_Bad.py", text)
    with pytest.raises(TaskError, match=expected) as err:
        load_kernelbench(checkout, levels=[1], profile="cpu")
    assert str(bad) in str(err.value)


def test_forward_that_raises_is_caught_by_check(checkout):
    bad = write(checkout, "level1/4_Raises.py", TASK.format(expr="x.view(3, -1, 7)"))
    assert len(load_kernelbench(checkout, [1])) == 4  # static checks cannot see it
    with pytest.raises(TaskError, match="forward") as err:
        load_kernelbench(checkout, [1], profile="cpu", check=True)
    assert str(bad) in str(err.value)


def test_skip_invalid_warns_and_keeps_the_rest(checkout, caplog):
    write(checkout, "level1/5_Bad.py", "def broken(:\n")
    write(checkout, "level1/4_Raises.py", TASK.format(expr="x.view(3, -1, 7)"))
    tasks = load_kernelbench(checkout, [1], profile="cpu", skip_invalid=True, check=True)
    assert [t.problem_id for t in tasks] == [1, 2, 10]
    assert "5_Bad.py" in caplog.text and "4_Raises.py" in caplog.text


def test_duplicate_problem_id_is_an_error(checkout):
    write(checkout, "level1/2_Again.py", TASK.format(expr="x"))
    with pytest.raises(TaskError, match="problem id 2"):
        load_kernelbench(checkout, [1])


def test_single_file_loader(checkout):
    task = load_task_file(checkout / "level1" / "2_Two.py", level=1)
    assert isinstance(task, Task) and task.id == "L1/2_Two"
    with pytest.raises(TaskError, match="ID_Name.py"):
        load_task_file(write(checkout, "level1/nonumber.py", TASK.format(expr="x")), level=1)


def test_split_is_deterministic_disjoint_and_per_level():
    tasks = load_builtin()
    train, hold = split(tasks, 0.2, seed=7)
    assert split(tasks, 0.2, seed=7) == (train, hold)
    assert {t.id for t in train}.isdisjoint({t.id for t in hold})
    assert len(train) + len(hold) == len(tasks)
    assert {t.level for t in hold} == {1, 2}
    assert [t.id for t in train] == [t.id for t in tasks if t in train]  # input order kept
    assert split(tasks, 0.2, seed=8)[1] != hold
    assert split(tasks, 0.0, seed=0) == (list(tasks), [])
    with pytest.raises(ValueError, match="holdout_frac"):
        split(tasks, 1.0, seed=0)


def test_full_profile_shapes_check_out_on_the_meta_device():
    """The H200-size references build and run on 'meta' tensors (shapes only, no compute)."""
    import torch

    from rewards.tasks.reference import load_module

    for task in load_builtin(profile="full"):
        module = load_module(task)
        with torch.device("meta"):
            model = module.Model(*module.get_init_inputs())
            inputs = module.get_inputs()
            out = model(*inputs)
        assert all(o.device.type == "meta" for o in (out if isinstance(out, tuple) else (out,))), task.id
        if task.level == 1:
            assert max(x.numel() for x in inputs) >= 16 * 2**20, task.id  # kernel time >> launch overhead


def test_sizes_set_constants_by_task_id_and_pattern(checkout):
    from rewards.tasks.sizes import resize_tasks

    tasks = load_kernelbench(checkout, levels=[1, 2])
    one = resize_tasks(tasks, ["L1/2_Two:N=64"])
    by_id = {t.id: t for t in one}
    assert "N = 64\n" in by_id["L1/2_Two"].source and "N = 1024\n" in by_id["L1/1_One"].source
    ast.parse(by_id["L1/2_Two"].source)  # still one valid file
    assert by_id["L1/2_Two"].source.replace("N = 64", "N = 1024") == {t.id: t for t in tasks}["L1/2_Two"].source
    # a pattern: every match that assigns the name; the later entry wins
    many = {t.id: t.source for t in resize_tasks(tasks, ["L1/*:N=32", "L1/10_*:N=16"])}
    assert "N = 32\n" in many["L1/1_One"] and "N = 16\n" in many["L1/10_Ten"] and "N = 1024\n" in many["L2/3_Fused"]
    # a constant KernelBench writes as an expression (N = 2048 * 2) is one a pattern reaches too
    from rewards.tasks.source import constants

    assert constants("N = 2048 * 2\nM: int = 3\na, b = 1, 2\n") == {"N"}


@pytest.mark.parametrize("entry, words", [
    ("L1/2_Two", "TASK_ID_OR_PATTERN:NAME=INT"),           # no sizes
    ("L1/2_Two:N=0", "positive"),                          # not a size
    ("L1/2_Two:N=big", "positive"),
    ("L1/99_Nine:N=8", "changes no task"),                 # no such task
    ("L3/*:N=8", "changes no task"),                       # a pattern that matches nothing
    ("L1/*:M=8", "changes no task"),                       # a pattern whose name no match assigns
    ("L1/2_Two:M=8", "not module-level constants"),        # one task, a name it does not assign
])
def test_a_bad_sizes_entry_is_an_error_naming_it(checkout, entry, words):
    from rewards.tasks.sizes import resize_tasks

    with pytest.raises(TaskError, match="reward.sizes") as e:
        resize_tasks(load_kernelbench(checkout, levels=[1, 2]), [entry])
    assert words in str(e.value) and entry.split(":")[0] in str(e.value)


def test_the_env_prompts_and_runs_the_resized_task():
    from rewards.config import load_reward_config
    from rewards.env import KernelEnv
    from rewards.interface import TaskRef

    cfg = load_reward_config("kernel", backend="cpu", holdout_frac=0.0, sizes=["L1/17_relu:BATCH=3,DIM=5"])
    env = KernelEnv(cfg, eval_pool=None)
    task = env.task("L1/17_relu")
    assert "BATCH = 3\n" in task.source and "DIM = 5\n" in task.source
    assert "BATCH = 3\n" in env.messages(TaskRef(task.id), [])[1]["content"]  # what the model is shown
    ns: dict = {}
    exec(compile(task.source, task.path, "exec"), ns)
    assert tuple(ns["get_inputs"]()[0].shape) == (3, 5)
    with pytest.raises(ValueError, match="reward.sizes"):
        load_reward_config("kernel", sizes=["L1/17_relu"])
