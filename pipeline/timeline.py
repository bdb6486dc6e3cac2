"""What each part of the loop did when: spans (lane, kind, step, start, end) recorded by the loop, drawn as a
bar chart (matplotlib, headless) and queried for overlap (the one-off schedule's whole point).

Lanes: ``sampler`` (gen: first prompt in to last token out of a batch), ``reward`` (union of the
per-sample evaluation intervals, last token of a sample -> its score), ``trainer`` (train) and
``push`` (weight push).

``python -m pipeline.timeline RUN_DIR`` redraws ``timeline.png`` from ``timeline.jsonl`` and
prints each step's times from ``metrics.jsonl`` (``timing_s/*``, verl's names).
"""
from __future__ import annotations

import json
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

LANES = ("sampler", "reward", "trainer", "push")
COLORS = {"gen": "#4C72B0", "reward": "#DD8452", "train": "#55A868", "push": "#C44E52"}
_OLD_NAMES = {"sync": "push"}


@dataclass
class Span:
    lane: str
    kind: str      # gen | reward | train | push
    step: int      # the batch the work belongs to
    start: float   # time.time()
    end: float


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if b < a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


class Timeline:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.t0: float | None = None

    def add(self, lane: str, kind: str, step: int, start: float, end: float) -> None:
        if lane not in LANES:
            raise ValueError(f"timeline lane {lane!r}: expected one of {LANES}")
        self.spans.append(Span(lane, kind, step, start, end))
        self.t0 = start if self.t0 is None else min(self.t0, start)

    def add_rewards(self, step: int, intervals: Iterable[tuple[float, float]]) -> None:
        for a, b in merge_intervals(intervals):
            self.add("reward", "reward", step, a, b)

    def of(self, kind: str, step: int | None = None) -> list[Span]:
        return [s for s in self.spans if s.kind == kind and (step is None or s.step == step)]

    def overlap(self, kind_a: str, step_a: int, kind_b: str, step_b: int) -> float:
        """Seconds during which work ``kind_a`` of batch ``step_a`` ran alongside ``kind_b`` of ``step_b``."""
        total = 0.0
        for a in self.of(kind_a, step_a):
            for b in self.of(kind_b, step_b):
                total += max(0.0, min(a.end, b.end) - max(a.start, b.start))
        return total

    def busy(self, lane: str, t0: float, t1: float) -> float:
        """Share of [t0, t1] during which the lane had work (its spans' union, clipped)."""
        if t1 <= t0:
            return 0.0
        clipped = [(max(s.start, t0), min(s.end, t1)) for s in self.spans if s.lane == lane]
        return sum(b - a for a, b in merge_intervals(clipped)) / (t1 - t0)

    def to_jsonl(self, path: str | Path) -> None:
        with open(path, "w") as f:
            for s in self.spans:
                f.write(json.dumps(asdict(s)) + "\n")

    @classmethod
    def from_jsonl(cls, path: str | Path) -> "Timeline":
        tl = cls()
        for line in Path(path).read_text().splitlines():
            d = json.loads(line)
            # run dirs written before the weight push had one name call its lane and spans "sync"
            lane, kind = (_OLD_NAMES.get(d["lane"], d["lane"]), _OLD_NAMES.get(d["kind"], d["kind"]))
            tl.add(lane, kind, d["step"], d["start"], d["end"])
        return tl

    def draw(self, path: str | Path, title: str = "", last_steps: int | None = None) -> Path:
        """Bars per lane; each bar labelled with its batch. Returns the PNG's path."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        spans = self.spans
        if last_steps is not None and spans:
            top = max(s.step for s in spans)
            spans = [s for s in spans if s.step > top - last_steps]
        t0 = min((s.start for s in spans), default=0.0)
        fig, ax = plt.subplots(figsize=(10, 2.8))
        for y, lane in enumerate(reversed(LANES)):
            for s in (s for s in spans if s.lane == lane):
                ax.broken_barh([(s.start - t0, max(s.end - s.start, 1e-3))], (y - 0.35, 0.7),
                               color=COLORS.get(s.kind, "grey"), alpha=0.9)
                if s.kind != "reward" and s.end - s.start > 0:
                    ax.text((s.start + s.end) / 2 - t0, y, str(s.step), ha="center",
                            va="center", fontsize=7, color="white")
        ax.set_yticks(range(len(LANES)), list(reversed(LANES)))
        ax.set_xlabel("seconds")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
        ax.legend(handles, list(COLORS), loc="upper center", ncol=4, fontsize=7,
                  bbox_to_anchor=(0.5, 1.25), frameon=False)
        if title:
            ax.set_title(title, fontsize=9, loc="left")
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


# lane -> the logged metric (docs/metrics.md) that times it
LANE_METRICS = {"sampler": "timing_s/gen", "reward": "timing_s/reward", "trainer": "timing_s/train",
                "push": "timing_s/update_weights", "step": "timing_s/step"}


class Drawer:
    """Writes a timeline's ``timeline.jsonl`` and ``timeline.png`` in ``run_dir`` off the step
    loop's critical path (matplotlib costs ~0.3 s a figure, ~1 s the first), one at a time in a
    thread of its own."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []

    def submit(self, timeline: Timeline, title: str) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="timeline")
        snapshot = Timeline()
        snapshot.spans = list(timeline.spans)  # the loop goes on adding to its own
        run_dir = self.run_dir

        def job() -> Path:
            snapshot.to_jsonl(run_dir / "timeline.jsonl")
            return snapshot.draw(run_dir / "timeline.png", title=title)

        self._pending.append(self._pool.submit(job))

    def drawn(self, wait: bool) -> Path | None:
        """The image written last once every one submitted is written (``wait``: waits for
        them), else None: only the newest image is worth a log entry."""
        path = None
        while self._pending and (wait or self._pending[0].done()):
            path = self._pending.pop(0).result()
        return None if self._pending else path

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def step_timings(line: dict[str, float]) -> dict[str, float]:
    """Seconds per lane (and the whole step) of one metrics.jsonl line."""
    return {lane: float(line[name]) for lane, name in LANE_METRICS.items() if name in line}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pipeline.timeline RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    spans, metrics = run_dir / "timeline.jsonl", run_dir / "metrics.jsonl"
    if not spans.exists() and not metrics.exists():
        print(f"{run_dir}: neither timeline.jsonl nor metrics.jsonl (is it a run dir?)", file=sys.stderr)
        return 2
    if spans.exists():
        print(Timeline.from_jsonl(spans).draw(run_dir / "timeline.png", title=str(run_dir)))
    if metrics.exists():
        for text in metrics.read_text().splitlines():
            line = json.loads(text)
            times = "  ".join(f"{k}={v:.2f}s" for k, v in step_timings(line).items())
            print(f"step {int(line.get('step', -1))}: {times}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
