"""bench.redteam's schedule for a GPU (every answer in one queue, the correct answer only where the
verdict is judged against it and once per task at the end, a budget past which nothing starts),
run here on the CPU backend: the H200 run of the red team is one command, and must not find its
bugs there."""
from __future__ import annotations

import json

import pytest

from bench.redteam import amain, arguments

pytestmark = pytest.mark.asyncio


async def test_the_queue_schedule_writes_every_answer_and_the_correct_answers_after_them(tmp_path):
    out = tmp_path / "rt.json"
    args = arguments().parse_args(["--backend", "cpu", "--only", "A03,A09,A16", "--schedule", "queue",
                                   "--follow", "needed", "--parallel", "3", "--out", str(out)])
    assert await amain(args) == 0
    data = json.loads(out.read_text())
    rows = {r["answer"]: r for r in data["rows"]}
    assert set(rows) == {"A03_cache_by_data_ptr", "A09_zeros", "A16_patches_its_clocks", "after_all_relu"}
    assert all(r["as_expected"] for r in rows.values()), data["summary"]
    # A16's bound is judged against the correct answer right after it; A03's verdict is not
    assert rows["A16_patches_its_clocks"]["follow"]["correct"] and not rows["A03_cache_by_data_ptr"]["follow"]
    assert data["summary"]["schedule"] == "queue" and data["summary"]["not_run"] == []
    assert "A09_zeros" in out.with_suffix(".md").read_text()
    partial = [json.loads(line)["answer"] for line in out.with_suffix(".partial.jsonl").read_text().splitlines()]
    assert sorted(partial) == ["A03_cache_by_data_ptr", "A09_zeros", "A16_patches_its_clocks"]


async def test_answers_past_the_budget_are_listed_as_not_run(tmp_path):
    out = tmp_path / "rt.json"
    args = arguments().parse_args(["--backend", "cpu", "--only", "A09", "--schedule", "queue", "--follow", "needed",
                                   "--budget", "0", "--out", str(out)])
    assert await amain(args) == 1
    summary = json.loads(out.read_text())["summary"]
    assert summary["not_run"] == ["A09_zeros"] and summary["unexpected"] == ["A09_zeros"]
