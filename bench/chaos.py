"""Chaos: the toy pipeline (``python -m pipeline.main +experiment=toy``) with actors SIGKILLed at
random moments, several times per run, against unfaulted runs of the same config.

Per run, ``--kills`` moments are drawn uniformly over the run's expected training time (the
unfaulted runs' wall time per step x steps, counted from the first logged step, so that Ray and
the actors are up); at each, one process is chosen at random among the run's Ray actors of a
kind drawn from ``--victims`` (``sampler``: ``SamplerWorker``; ``trainer``: ``TrainerWorker``) and
killed with SIGKILL. The actor's process title at that instant (``ray::SamplerWorker.generate``,
``...receive_weights``, ``ray::SamplerWorker`` when idle) says what it was doing. In the toy env
the evaluation of an answer runs inside the sampler actor (there is no separate evaluation
worker; a kernel env's sandbox workers are tests/reliability/test_faults.py's), so killing a
sampler while it scores is among the sampler moments.

A lost trainer is restarted inside the run from its latest checkpoint (``pipeline.max_trainer_restarts``
times; the ``trainer lost at step`` lines of the run's log are counted). Past that bound the run
stops with the resume line: the driver then does what it says, the same command with
``resume=auto``, as a scheduler would, and counts it.

Bar: every faulted run reaches its last step with the same number of trained samples
as an unfaulted run (sum of ``perf/samples`` over the steps of ``metrics.jsonl``), and a final
reward (``critic/score/mean``, mean of the last 3 steps) within the unfaulted runs' spread, taken
as their mean - 3 sd (sample sd of ``--clean-runs`` runs: with a range of a few runs as the bar,
an unfaulted run itself falls below it 1/(n+1) of the time, 1/4 with 3). The faulted and unfaulted
means are also compared by a permutation test (``reward_p_value``: the share of 10 000 random
relabellings of the pooled runs whose mean difference is at least the observed one, two-sided).

    python -m bench.chaos --runs 20 --clean-runs 12 --steps 8 --kills 3 --out bench/baselines/cpu/chaos.json

Written by hand: no library injects faults into Ray actors by role at random moments.
"""
from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import parser, progress, report

ROOT = Path(__file__).resolve().parents[1]
ACTORS = {"sampler": "ray::SamplerWorker", "trainer": "ray::TrainerWorker"}


def actor_processes(tag: str, kind: str) -> list[tuple[int, str]]:
    """(pid, process title) of the ``kind`` actors of one run: the processes whose environment
    holds ``CHAOS_RUN=tag`` (Ray's workers inherit the driver's; they are not its descendants)."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            title = " ".join(p.info["cmdline"] or [])
            if title.startswith(ACTORS[kind]) and p.environ().get("CHAOS_RUN") == tag:
                out.append((p.pid, title.split()[0]))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def read_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """The last row of each step in ``metrics.jsonl`` (a resumed run rewrites the steps it redoes)."""
    path = run_dir / "metrics.jsonl"
    rows: dict[int, dict[str, float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line being written
                continue
            rows[int(row["step"])] = row
    return rows


def summary(rows: dict[int, dict[str, float]], steps: int) -> dict[str, Any]:
    last = [rows[s]["critic/score/mean"] for s in sorted(rows)[-3:]]
    return {"steps_done": len(rows), "reached_end": (steps - 1) in rows,
            "trained_samples": int(sum(r.get("perf/samples", 0.0) for r in rows.values())),
            "final_reward": sum(last) / len(last) if last else float("nan")}


def run_one(run_dir: Path, steps: int, overrides: list[str], kills: int, victims: list[str],
            step_s: float, rng: random.Random, max_resumes: int, timeout_s: float) -> dict[str, Any]:
    """One run of the toy pipeline with ``kills`` SIGKILLs (0: unfaulted)."""
    base = [sys.executable, "-m", "pipeline.main", "+experiment=toy", f"pipeline.steps={steps}",
            f"hydra.run.dir={run_dir}", "pipeline.progress=false", *overrides]
    env = dict(os.environ, CHAOS_RUN=str(run_dir),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    plan = sorted(rng.uniform(0.0, step_s * steps) for _ in range(kills))
    done_kills: list[dict[str, Any]] = []
    resumes, t_ready, t_last, rc = 0, None, None, None
    t_start = time.time()
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    cmd = base
    try:
        while True:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            trainer_killed = False
            while (rc := proc.poll()) is None:
                if time.time() - t_start > timeout_s:
                    proc.kill()
                    proc.wait()
                    rc = "timeout"
                    break
                rows = read_metrics(run_dir)
                if t_ready is None and rows:
                    t_ready = time.time()
                if t_last is None and (steps - 1) in rows:
                    t_last = time.time()
                if t_ready is not None and plan and time.time() - t_ready >= plan[0] \
                        and (steps - 1) not in rows:
                    kind = rng.choice(victims)
                    found = actor_processes(str(run_dir), kind)
                    if found:
                        pid, title = rng.choice(found)
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            continue  # gone between the listing and the kill: draw again
                        plan.pop(0)
                        trainer_killed |= kind == "trainer"
                        done_kills.append({"kind": kind, "moment": title, "step": max(rows, default=-1) + 1,
                                           "t": round(time.time() - t_ready, 2)})
                        print(f"[chaos] {run_dir.name}: SIGKILL {title} pid {pid} at step "
                              f"{done_kills[-1]['step']}", file=sys.stderr, flush=True)
                time.sleep(0.05)
            if rc == 0 or rc == "timeout" or not trainer_killed or resumes >= max_resumes:
                break
            resumes += 1  # the lost trainer's resume line: the same command plus resume=auto
            cmd = base + ["resume=auto"]
    finally:
        log.close()
    restarts = (run_dir.parent / f"{run_dir.name}.log").read_text().count("[pipeline] trainer lost at step")
    row = {"run": run_dir.name, "rc": rc, "kills": len(done_kills), "restarts": restarts, "resumes": resumes,
           **summary(read_metrics(run_dir), steps),
           # the first logged step to the last: training, not Ray's start or teardown
           "wall_s": round((t_last or time.time()) - (t_ready or t_start), 1),
           "moments": ", ".join(f"{k['moment'].removeprefix('ray::')}@{k['step']}" for k in done_kills)}
    return row


def permutation_p(a: list[float], b: list[float], rounds: int = 10_000, seed: int = 0) -> float:
    """Two-sided permutation test of a difference of means (no SciPy in the CPU deps; a few lines)."""
    rng = random.Random(seed)
    observed = abs(statistics.fmean(a) - statistics.fmean(b))
    pooled, n = a + b, len(a)
    hits = 0
    for _ in range(rounds):
        rng.shuffle(pooled)
        hits += abs(statistics.fmean(pooled[:n]) - statistics.fmean(pooled[n:])) >= observed - 1e-12
    return (hits + 1) / (rounds + 1)


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="faulted runs")
    p.add_argument("--clean-runs", type=int, default=12, help="unfaulted runs (the reference spread)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--kills", type=int, default=3, help="SIGKILLs per faulted run")
    p.add_argument("--victims", default="sampler,trainer",
                   help="kinds to draw from, comma-separated (repeat one to weight it)")
    p.add_argument("--max-resumes", type=int, default=5)
    p.add_argument("--timeout-s", type=float, default=900.0, help="per run, resumes included")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parallel", type=int, default=1, help="runs at once (each its own Ray)")
    p.add_argument("--step-s", type=float, default=0.0,
                   help="seconds per step to draw the moments over (0: the unfaulted runs' own, "
                        "measured first; > 0: unfaulted and faulted runs all at once)")
    p.add_argument("--run-root", default="/tmp/chaos_runs")
    p.add_argument("--reuse-clean", default="",
                   help="a run root of an earlier bench whose finished clean* runs (same steps and "
                        "overrides) are the unfaulted reference instead of new ones")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run (after --)")
    args = p.parse_args()
    victims = [v for v in args.victims.split(",") if v]
    bad = [v for v in victims if v not in ACTORS]
    if bad:
        p.error(f"--victims: unknown kind(s) {bad}; expected {sorted(ACTORS)}")
    root = Path(args.run_root) / time.strftime("%Y%m%d_%H%M%S")
    root.mkdir(parents=True)
    from concurrent.futures import ThreadPoolExecutor

    def batch(jobs: list[tuple[str, int]], step_s: float) -> list[dict[str, Any]]:
        """Runs (name, kills), ``--parallel`` at a time, each with its own seeded draws."""
        def one(job: tuple[str, int]) -> dict[str, Any]:
            name, kills = job
            (root / name).mkdir()
            row = run_one(root / name, args.steps, args.overrides, kills, victims, step_s,
                          random.Random(f"{args.seed}-{name}"), args.max_resumes, args.timeout_s)
            progress("chaos", row)
            return row

        with ThreadPoolExecutor(args.parallel) as pool:
            return list(pool.map(one, jobs))

    reused = []
    if args.reuse_clean:
        for d in sorted(Path(args.reuse_clean).glob("clean*")):
            if d.is_dir():
                got = summary(read_metrics(d), args.steps)
                reused.append({"run": f"{d.name} (reused)", "rc": 0 if got["reached_end"] else "unfinished",
                               "kills": 0, "restarts": 0, "resumes": 0, **got, "wall_s": float("nan"),
                               "moments": ""})
        args.clean_runs = len(reused)
        if args.step_s <= 0:
            p.error("--reuse-clean needs --step-s")
    clean_jobs = [] if reused else [(f"clean{i}", 0) for i in range(args.clean_runs)]
    fault_jobs = [(f"fault{i}", args.kills) for i in range(args.runs)]
    if args.step_s > 0:  # moments drawn over a given step time: all runs at once
        step_s = args.step_s
        rows = reused + batch(clean_jobs + fault_jobs, step_s)
    else:  # over the unfaulted runs' own step time: those first
        rows = batch(clean_jobs, 1.0)
        done = [r for r in rows if r["rc"] == 0]
        step_s = sum(r["wall_s"] for r in done) / max(1, len(done)) / max(1, args.steps - 1)
        rows += batch(fault_jobs, step_s)
    clean = [r for r in rows[:args.clean_runs] if r["rc"] == 0]
    if not clean:
        sys.exit("no unfaulted run finished: see the logs under " + str(root))
    rewards = [r["final_reward"] for r in clean]
    lo, hi = min(rewards), max(rewards)
    mean = statistics.fmean(rewards)
    sd = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    floor = mean - 3 * sd
    want_samples = {r["trained_samples"] for r in clean}
    for row in rows[args.clean_runs:]:
        row["samples_ok"] = row["trained_samples"] in want_samples
        # "within the spread": not below the unfaulted runs' mean - 3 sd
        row["learns"] = row["final_reward"] >= floor
    faulted = rows[args.clean_runs:]
    ok = [r for r in faulted if r["rc"] == 0 and r["reached_end"] and r["samples_ok"] and r["learns"]]
    got = [r["final_reward"] for r in faulted if r["rc"] == 0]
    extra = {"run_root": str(root), "clean_final_reward_min": lo, "clean_final_reward_max": hi,
             "clean_final_reward_mean": mean, "clean_final_reward_sd": sd, "reward_floor": floor,
             "faulted_final_reward_mean": statistics.fmean(got) if got else float("nan"),
             "reward_p_value": permutation_p(rewards, got) if got else float("nan"),
             "faulted_below_clean_min": sum(x < lo for x in got),
             "clean_trained_samples": sorted(want_samples)[0] if len(want_samples) == 1 else str(want_samples),
             "step_s": step_s, "faulted_runs": len(faulted), "faulted_runs_meeting_the_bar": len(ok),
             "kills": sum(r["kills"] for r in faulted),
             "trainer_restarts": sum(r["restarts"] for r in faulted),
             "trainer_resumes": sum(r["resumes"] for r in faulted)}
    report("chaos", args, rows, extra, columns=["run", "rc", "kills", "restarts", "resumes", "steps_done",
                                                "trained_samples", "final_reward", "samples_ok",
                                                "learns", "wall_s", "moments"])


if __name__ == "__main__":
    main()
