"""A task's footprint on the meta device, and the load-time error for a task no GPU here can hold."""
from __future__ import annotations

import dataclasses

import pytest

from rewards.config import load_reward_config
from rewards.env import KernelEnv
from rewards.tasks import TaskError
from sandbox import footprint

BIG = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return x @ self.w


def get_inputs():
    return [torch.randn(65536, 65536)]


def get_init_inputs():
    return [65536]
'''


def test_the_footprint_is_measured_without_memory():
    fp = footprint.measure(BIG)
    assert fp.input_bytes == fp.param_bytes == fp.output_bytes == 65536 * 65536 * 4  # 16 GiB each, none drawn
    assert fp.minimum_bytes == 6 * 65536 * 65536 * 4
    assert footprint.too_big(fp, 200 * 2**30) is None
    why = footprint.too_big(fp, 80 * 2**30)
    assert why and "96.0 GiB" in why and "80.0 GiB" in why, why


def test_a_task_no_gpu_here_can_hold_is_named_at_load(monkeypatch, tmp_path):
    level = tmp_path / "level1"
    level.mkdir()
    (level / "1_huge_matmul.py").write_text(BIG)
    (level / "2_small.py").write_text(BIG.replace("65536", "64"))
    monkeypatch.setattr(footprint, "device_memory_bytes", lambda: [80 * 2**30])
    cfg = load_reward_config("kernel", backend="cuda", tasks=str(tmp_path), levels=[1], holdout_frac=0.0)
    with pytest.raises(TaskError, match=r"L1/1_huge_matmul .*needs at least 96.0 GiB.*80.0 GiB"):
        KernelEnv(cfg, eval_pool=None)
    cfg = load_reward_config("kernel", backend="cuda", tasks=str(tmp_path), levels=[1], holdout_frac=0.0,
                             skip_invalid_tasks=True)
    env = KernelEnv(cfg, eval_pool=None)
    assert [t.task_id for t in env.tasks("train")] == ["L1/2_small"]


def test_a_task_left_out_for_this_gpu_moves_no_other_task_between_the_splits(monkeypatch, tmp_path):
    """The held-out set is the split of the task files, whatever GPU loads them: a task too big for
    this one (skipped) leaves its own split only."""
    level = tmp_path / "level1"
    level.mkdir()
    (level / "1_huge_matmul.py").write_text(BIG)
    for i in range(2, 11):
        (level / f"{i}_small.py").write_text(BIG.replace("65536", "64"))

    def splits(memory):
        monkeypatch.setattr(footprint, "device_memory_bytes", lambda: [memory])
        cfg = load_reward_config("kernel", backend="cuda", tasks=str(tmp_path), levels=[1], holdout_frac=0.3,
                                 skip_invalid_tasks=True)
        env = KernelEnv(cfg, eval_pool=None)
        return [{t.task_id for t in env.tasks(s)} for s in ("train", "holdout")]

    train, holdout = splits(200 * 2**30)
    small_train, small_holdout = splits(80 * 2**30)
    assert "L1/1_huge_matmul" in train | holdout
    assert small_train == train - {"L1/1_huge_matmul"} and small_holdout == holdout - {"L1/1_huge_matmul"}


def test_a_step_is_admitted_on_at_least_what_it_holds_at_the_least():
    """The estimate a GPU run step is admitted on before its task has measured peaks (the judge
    sends the meta-device footprint with its ready): never below the bare minimum the judge and both
    runners hold, and each part of the footprint raises it."""
    from sandbox.devices import estimate as _estimate
    from sandbox.config import load_default_config

    cfg = load_default_config()
    fp = footprint.measure(BIG)
    est = footprint.step_estimate(fp, 2, cfg.gpu_flush_bytes, cfg.poison_bytes, cfg.gpu_context_bytes)
    assert est >= fp.minimum_bytes + 3 * cfg.gpu_context_bytes
    sent = {"input_bytes": fp.input_bytes, "param_bytes": fp.param_bytes, "output_bytes": fp.output_bytes,
            "peak_bytes": fp.peak_bytes, "input_sets": 2}
    assert _estimate(sent, cfg) == est
    for key in ("input_bytes", "param_bytes", "output_bytes", "input_sets", "peak_bytes"):
        assert _estimate({**sent, key: sent[key] * 2}, cfg) > est, key
    assert _estimate({**sent, "output_bytes": None}, cfg) is None   # no estimate: admitted alone
    assert _estimate({**sent, "input_bytes": -1}, cfg) is None
    assert _estimate({**sent, "peak_bytes": None}, cfg) > est       # unmeasured: three outputs' worth


CHAIN = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        {body}


def get_inputs():
    return [torch.randn(8192, 8192)]


def get_init_inputs():
    return []
'''


@pytest.mark.parametrize("body, peak", [("return torch.relu(x)", 1),                 # the output alone
                                        ("return x * torch.sigmoid(x)", 2),          # one temporary beside it
                                        ("a = x + 1\n        b = a * 2\n        c = b - 3\n        return a + b + c", 5),  # a, b, c, a + b and the output
                                        ("return (x + 1).view(-1).relu_()", 1)])     # views and in-place: no new bytes
def test_the_forward_peak_counts_live_tensors_and_sizes_the_estimate(body, peak):
    """The most bytes the forward's own tensors hold at once, on the meta device (inputs and
    parameters not counted): an elementwise task is admitted on less than three outputs' worth per
    runner, and a forward that keeps temporaries alive on more."""
    from sandbox.config import load_default_config

    cfg = load_default_config()
    n = 8192 * 8192 * 4
    fp = footprint.measure(CHAIN.format(body=body))
    assert fp.output_bytes == n and fp.peak_bytes == peak * n
    est = footprint.step_estimate(fp, 2, cfg.gpu_flush_bytes, cfg.poison_bytes, cfg.gpu_context_bytes)
    unmeasured = footprint.step_estimate(dataclasses.replace(fp, peak_bytes=None), 2, cfg.gpu_flush_bytes,
                                         cfg.poison_bytes, cfg.gpu_context_bytes)
    assert (est < unmeasured) if peak <= 2 else (est > unmeasured), (est, unmeasured)


def test_a_task_measured_over_the_gates_budget_is_said_once(caplog, tmp_path):
    """A footprint learned from a step that ran alone, larger than what the GPU's gate admits on
    (gpu_memory_share): such steps run alone and over the share, and the pool says so once."""
    import logging

    from sandbox.config import load_default_config
    from sandbox.pool import SandboxPool

    cfg = load_default_config(cache_dir=str(tmp_path))
    pool = SandboxPool(cfg)
    profile = {"judge_peak_bytes": 20 * 2**30, "reference_peak_bytes": 8 * 2**30}
    with caplog.at_level(logging.WARNING, logger="sandbox.pool"):
        pool._learn_footprint("L1/19_ReLU", profile, cfg, budget=25 * 2**30)
        pool._learn_footprint("L1/19_ReLU", profile, cfg, budget=25 * 2**30)   # known: nothing new
        pool._learn_footprint("L1/40_LayerNorm", {"judge_peak_bytes": 2**30, "reference_peak_bytes": 2**29},
                              cfg, budget=25 * 2**30)
    said = [r.getMessage() for r in caplog.records if "more than" in r.getMessage()]
    assert len(said) == 1 and "L1/19_ReLU" in said[0] and "25.0 GiB" in said[0], said
    assert pool._footprints["L1/19_ReLU"] > 25 * 2**30 > pool._footprints["L1/40_LayerNorm"]
