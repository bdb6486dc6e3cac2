"""The benchmarks' own arithmetic: what they report must mean what docs/performance.md says."""
import math
from types import SimpleNamespace

import pytest
import torch

from bench.common import percentile, table
from bench.trainer import PRESETS, layout, make_micro_batches


def test_percentile_is_nearest_rank():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 95) == 5.0
    assert percentile(xs, 0) == 1.0
    assert math.isnan(percentile([], 50))


def test_table_has_a_row_per_result_and_markdown_header():
    out = table([{"a": 1, "b": 0.5}, {"a": 2, "b": None}]).splitlines()
    assert out[0].split("|")[1].strip() == "a" and set(out[1]) <= {"|", "-", " "}
    assert len(out) == 4 and out[3].split("|")[2].strip() == "-"


def test_micro_batches_respect_the_padded_budget():
    lengths = [100, 300, 50, 400, 400, 10]
    micro = make_micro_batches(lengths, budget=800)
    assert [n for m in micro for n in m] == lengths  # order kept, nothing lost
    assert all(max(m) * len(m) <= 800 or len(m) == 1 for m in micro)


def test_packed_and_padded_layouts_give_the_same_loss():
    """Packing must change the cost only: the same rows give the same next-token loss."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    arch = dict(PRESETS["cpu-small"], vocab_size=300, num_hidden_layers=1)
    cfg = Qwen2Config(**arch)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    lens = [7, 3, 12]
    losses = []
    for packed in (False, True):
        torch.manual_seed(1)  # same token ids in both layouts
        mb = layout(lens, 300, packed, torch.device("cpu"))
        labels = mb.pop("labels")
        with torch.no_grad():
            logits = model(**mb, use_cache=False).logits
        losses.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                        ignore_index=-100, reduction="sum"))
        assert int((labels != -100).sum()) == sum(n - 1 for n in lens)
    assert torch.allclose(losses[0], losses[1], rtol=1e-5)


def _history(k, steps=6, gen=1.0, train=1.0):
    """A bench.pipeline history: for k > 0 the last k steps have nothing left to generate."""
    out = []
    for s in range(steps):
        g = 0.0 if k and s >= steps - k else gen
        step = (g + train) if k == 0 else max(g, train)
        out.append({"step": s, "timing_s/step": step + 0.1 * (s % 2), "timing_s/gen": g * 0.8,
                    "timing_s/reward": g * 0.2, "timing_s/gen_total": g, "timing_s/train": train,
                    "timing_s/update_weights": 0.0, "timing_s/score_p95": 0.4 if g else 0.0,
                    "pipeline/policy_lag": float(min(s, k))})
    return out


def test_pipeline_bench_leaves_out_the_steps_with_nothing_to_generate():
    from bench.pipeline import compare, steady_steps, summarise

    h2 = _history(2)
    assert [h["step"] for h in steady_steps(h2, 2)] == [1, 2, 3]  # 4 and 5 only train
    assert [h["step"] for h in steady_steps(_history(0), 0)] == [1, 2, 3, 4]
    rows = [summarise(k, _history(k), 1.0) for k in (0, 1, 2)]
    assert [r["gen_plus_reward_s"] for r in rows] == [1.0, 1.0, 1.0]  # no gen-less step averaged in
    assert rows[2]["step_s"] == pytest.approx((1.1 + 1.0 + 1.1) / 3)
    assert rows[1]["tail_over_eval_p95"] == pytest.approx(0.2 / 0.4)
    c = compare(rows)
    assert c["sync_balance_ratio"] == pytest.approx(1.0) and c["sync_balanced"]
    assert c["speedup_bound_one_off"] == pytest.approx(2.0)
    assert c["speedup_k1_over_k0"] == pytest.approx(rows[0]["step_s"] / rows[1]["step_s"])
    assert c["speedup_k1_share_of_bound"] == pytest.approx(c["speedup_k1_over_k0"] / 2.0)
    assert c["speedup_k1_noise"] > 0 and c["bar_speedup_at_least_0.9_bound"] == "met"
    assert c["bar_reward_tail_within_eval_p95"] == "met"


def test_pipeline_bench_busy_shares_of_the_steady_window():
    from bench.pipeline import busy_shares
    from pipeline.timeline import Timeline

    tl = Timeline()
    for s in range(4):  # sync schedule: gen 1 s, train 1 s, push 0.5 s
        t = 2.5 * s
        tl.add("sampler", "gen", s, t, t + 1.0)
        tl.add("trainer", "train", s, t + 1.0, t + 2.0)
        tl.add("push", "push", s, t + 2.0, t + 2.5)
    hist = [{"step": s} for s in range(4)]
    busy = busy_shares(tl, hist, hist[1:3])  # window: end of push 0 (2.5) -> end of push 2 (7.5)
    assert busy == {"busy_sampler": pytest.approx(0.4), "busy_reward": 0.0,
                    "busy_trainer": pytest.approx(0.4), "busy_push": pytest.approx(0.2)}


def test_stored_answers_parse_pass_the_rules_and_keep_their_share():
    from bench.stored_answers import StoredAnswerEnv, answer_text
    from rewards.config import load_reward_config
    from rewards.env import KernelEnv
    from rewards.parse import parse_response
    from rewards.solutions import available

    for backend in ("cpu", "cuda"):
        env = StoredAnswerEnv(KernelEnv(load_reward_config("kernel", backend=backend), eval_pool=None),
                              share=0.25, variants=3)
        ids = [r.task_id for r in env.tasks("train")]
        assert ids and set(ids) <= set(available(backend)) and env.tasks("holdout") == env.tasks("train")
        for task_id, code in env._code.items():
            for variant in (0, 2):
                parsed = parse_response(answer_text(code, variant))
                assert parsed.ok and env.inner.check(parsed.code) == [], (backend, task_id)
                assert (f"// bench variant {variant}" in parsed.code) == bool(variant)
    assert [env.stored(c) for c in range(1, 9)] == [False, False, False, True] * 2
    assert all(StoredAnswerEnv.stored(SimpleNamespace(share=1.0), c) for c in range(1, 5))


def test_trainer_levers_expand_named_sets_and_run_liger_rows_last():
    from bench.trainer_rl import LEVER_SETS, parse_levers, rl_label

    rows = parse_levers("qwen0.5b/packed+liger,levers", "qwen0.5b", False)
    assert len(rows) == 1 + len(LEVER_SETS["levers"])
    assert rows[-1] == dict(preset="qwen0.5b", layout="packed", compile=False, liger=True, ckpt=False, chead=False,
                        ckpt_share=1.0)
    assert rows[0] == dict(preset="qwen1.5b", layout="packed", compile=True, liger=False, ckpt=False, chead=False,
                       ckpt_share=1.0)
    assert parse_levers("", "qwen1.5b", True) == [dict(preset="qwen1.5b", layout="padded", compile=True,
                                                       liger=False, ckpt=False, chead=False, ckpt_share=1.0)]
    assert parse_levers("levers-head", "qwen0.5b", False)[0]["chead"] is True
    (part,) = parse_levers("qwen3b/packed+compile+ckpt33", "qwen0.5b", False)
    assert part["ckpt"] is True and part["ckpt_share"] == 0.33
    assert rl_label(32768, 1024, part).startswith("rl_step qwen3b/packed+compile+ckpt33 ")
    with pytest.raises(SystemExit):
        parse_levers("qwen3b/packed+ckpt0", "qwen0.5b", False)
    with pytest.raises(SystemExit, match="qwen0.5b/unpadded"):
        parse_levers("qwen0.5b/unpadded", "qwen0.5b", False)


def test_stored_answers_keep_the_first_tasks_when_limited():
    from bench.stored_answers import StoredAnswerEnv
    from rewards.config import load_reward_config
    from rewards.env import KernelEnv

    inner = KernelEnv(load_reward_config("kernel", backend="cuda"), eval_pool=None)
    every = [r.task_id for r in StoredAnswerEnv(inner).tasks("train")]
    three = [r.task_id for r in StoredAnswerEnv(inner, tasks=3).tasks("train")]
    assert len(every) > 3 and three == sorted(every)[:3]


def test_pipeline_bench_summarises_one_k_per_file_as_one_run(tmp_path, monkeypatch, capsys):
    import json
    import sys

    from bench import pipeline as bp

    files = []
    for k in (0, 1):
        path = tmp_path / f"k{k}.json"
        path.write_text(json.dumps({"overrides": "pipeline.steps=6 x=1", "machine": "test",
                                    "rows": [{"k": k, "wall_s": 10.0 + k}], "history": {str(k): _history(k)}}))
        files.append(str(path))
    out = tmp_path / "both.json"
    monkeypatch.setattr(sys, "argv", ["bench.pipeline", "--summarise", ",".join(files), "--out", str(out)])
    bp.main()
    both = json.loads(out.read_text())
    assert [r["k"] for r in both["rows"]] == [0, 1]
    assert both["speedup_bound_one_off"] == pytest.approx(2.0)
    assert both["speedup_k1_over_k0"] == pytest.approx(both["rows"][0]["step_s"] / both["rows"][1]["step_s"])
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"overrides": "pipeline.steps=6 x=2", "machine": "test",
                               "rows": [{"k": 2, "wall_s": 1.0}], "history": {"2": _history(2)}}))
    monkeypatch.setattr(sys, "argv", ["bench.pipeline", "--summarise", f"{files[0]},{bad}"])
    with pytest.raises(SystemExit, match="different overrides"):
        bp.main()


def test_pipeline_bench_keeps_what_a_cut_run_logged(tmp_path, monkeypatch):
    import json
    import sys

    from bench import pipeline as bp

    def cut_run(k, overrides, run_dir, env_factory=None):  # a run its call's limit stopped in step 3
        run_dir.mkdir(parents=True)
        with open(run_dir / "metrics.jsonl", "w") as f:
            for h in _history(k)[:3]:
                f.write(json.dumps(h) + "\n")
        raise RuntimeError("the trainer was lost after a stop was requested")

    monkeypatch.setattr(bp, "run_k", cut_run)
    out = tmp_path / "p.json"
    monkeypatch.setattr(sys, "argv", ["bench.pipeline", "--ks", "0,1", "--steps", "6",
                                      "--run-root", str(tmp_path / "runs"), "--out", str(out)])
    with pytest.raises(RuntimeError, match="stop was requested"):
        bp.main()
    got = json.loads(out.read_text())
    assert [r["k"] for r in got["rows"]] == [0]  # k = 1 was not started after the cut
    assert "RuntimeError" in got["cut"]["0"] and [h["step"] for h in got["history"]["0"]] == [0, 1, 2]
    assert got["rows"][0]["step_s"] == pytest.approx(_history(0)[1]["timing_s/step"])


def test_gc_pauses_are_counted_and_taken_once():
    import gc

    from bench.sampler import GCPauses

    pauses = GCPauses()
    try:
        pauses.take()
        junk = [[i] for i in range(50_000)]
        gc.collect()
        first = pauses.take()
        assert first > 0.0 and pauses.take() == 0.0
        del junk
    finally:
        pauses.close()
    gc.collect()
    assert pauses.take() == 0.0  # closed: no longer called
