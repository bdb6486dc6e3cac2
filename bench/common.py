"""What every benchmark shares: the machine description, percentiles, the table, the JSON file."""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence


def machine() -> dict[str, Any]:
    """Where the numbers came from: enough to tell the CPU box from the H200."""
    info: dict[str, Any] = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpus"] = torch.cuda.device_count()
    except Exception as e:  # a benchmark that needs no torch still reports the machine
        info["torch"] = f"unavailable ({type(e).__name__})"
    return info


def baseline_path(name: str) -> str:
    """``bench/baselines/<device>/<name>.json``: where the JSON behind a figure of docs/performance.md
    is kept (device ``cpu``, ``h100``, ``h200``, or the GPU's name in lower case)."""
    gpu = machine().get("gpu", "")
    device = next((d for d in ("h100", "h200") if d in gpu.lower()), None)
    device = device or ("".join(c if c.isalnum() else "_" for c in gpu.lower()).strip("_") or "cpu")
    return f"bench/baselines/{device}/{name}.json"


def ninja_seconds(ext_dir: Path, key: Any) -> dict[str, float]:
    """Seconds of each build step in ``ext_dir``'s .ninja_logs, summed under ``key(target)``."""
    out: dict[str, float] = {}
    for log in Path(ext_dir).rglob(".ninja_log"):
        for line in log.read_text().splitlines():
            if line.startswith("#"):
                continue
            start_ms, end_ms, _, target, *_ = line.split("\t")
            k = key(target)
            out[k] = out.get(k, 0.0) + (int(end_ms) - int(start_ms)) / 1000
    return out


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); nan for an empty list."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return float(s[k])


def fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 0.01 or a == 0:
            return f"{v:.3f}"
        return f"{v:.2e}"
    return "-" if v is None else str(v)


def table(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Plain-text table; also valid Markdown, so it pastes into docs/performance.md."""
    rows = list(rows)
    if not rows:
        return "(no rows)"
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"
    out = [line(cols), "| " + " | ".join("-" * w for w in widths) + " |"]
    out += [line(row) for row in cells]
    return "\n".join(out)


def set_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs (repeatable) as a dict of sandbox config overrides, typed as
    OmegaConf reads them (``true`` a bool, ``8`` an int)."""
    if not pairs:
        return {}
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.from_dotlist(list(pairs)))  # type: ignore[return-value]


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=None, help="write the results as JSON to this file")
    return p


def report(name: str, args: argparse.Namespace, rows: list[dict[str, Any]],
           extra: dict[str, Any] | None = None, columns: Sequence[str] | None = None) -> dict[str, Any]:
    """Print the table (last, so a device call's output tail holds it) and write the JSON."""
    result = {"bench": name, "machine": machine(), "command": " ".join([f"python -m bench.{name}"] + sys.argv[1:]),
              "args": {k: v for k, v in vars(args).items()}, "rows": rows, **(extra or {})}
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2, default=str))
    print(f"\n## bench.{name} on {result['machine'].get('gpu', 'CPU')} "
          f"({result['machine']['cpus']} cpus, {result['machine']['date_utc']} UTC)")
    for k, v in (extra or {}).items():
        if isinstance(v, (int, float, str, bool)):
            print(f"{k}: {fmt(v)}")
    print(table(rows, columns), flush=True)
    return result


def progress(name: str, row: dict[str, Any]) -> None:
    """One finished row at once: a device call cut at its limit still shows what was done."""
    print(f"[bench.{name}] " + "  ".join(f"{k}={fmt(v)}" for k, v in row.items()), flush=True)


def target(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "MISSED")
