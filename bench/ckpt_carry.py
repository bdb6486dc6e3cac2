"""Carry a LoRA run's latest checkpoint off a machine whose output comes back in small files, and
put it back on the next machine, so that one run spans several sessions there.

A lent GPU machine returns at most 8 files of 16 MiB each, and a fresh one starts bare; a full
checkpoint of a 1.5B policy (3.4 GB of merged weights, 12 GB of optimiser state) cannot travel.
What a LoRA run needs to go on is small: the adapter (rank 16 on all linear layers of a 1.5B:
18.5M parameters, 37 MB in bfloat16), ``loop.pt`` (step, data cursor, RNG, the batch already
generated in one_off mode) and the learning-rate schedule's position. The frozen base is rebuilt
from ``model.path`` on resume, as a LoRA resume always does (pipeline/trainer/lora.py).

There, at the end of a call::

    python -m bench.ckpt_carry pack RUN_DIR "$OUT"       # -> $OUT/ckpt.tar.01 .. (<= 15 MiB each)

writes the newest checkpoint under ``RUN_DIR/checkpoints`` with the run's ``config.json`` and
``metrics.jsonl`` into one tar, split into parts; a manifest inside holds each member's sha256.
Here, copy the parts into an ignored folder (``.carry/``), carry it, and on the next machine::

    python -m bench.ckpt_carry unpack .carry RUN_DIR

rebuilds ``RUN_DIR/checkpoints/step_N/`` (``adapter/``, ``loop.pt``, ``optimizer.pt``) and the
run's config and metrics; the same run command with ``resume=auto`` continues at step N+1.

What stays behind, said here so nobody is surprised: the optimiser's moments (Adam's two fp32
tensors per adapter weight, 148 MB at rank 16): the resumed run starts them from zero, at the
schedule's saved step (the trainer says so in one line); ``model/`` (the merged policy, rebuilt
from base + adapter at the first push); the adapter's fp32 master copy (rounded to bfloat16, a
relative change of at most 2^-9 per weight). A full-model checkpoint is refused with its size.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path

import torch

PART_MIB = 15
PREFIX = "ckpt.tar."
MANIFEST = "MANIFEST.json"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def members(run_dir: Path, ckpt_dirname: str, dtype: torch.dtype) -> dict[str, bytes]:
    """The files that travel, by their path under the run dir."""
    from safetensors.torch import load_file, save

    from pipeline import checkpoint
    from pipeline.trainer.lora import ADAPTER_DIR

    ckpt = checkpoint.latest(run_dir / ckpt_dirname)
    if ckpt is None:
        raise SystemExit(f"[ckpt_carry] no checkpoint under {run_dir / ckpt_dirname}")
    adapter = ckpt / ADAPTER_DIR
    if not (adapter / "adapter_model.safetensors").exists():
        size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
        raise SystemExit(f"[ckpt_carry] {ckpt} holds no adapter/ (a full-model checkpoint, "
                         f"{size / 2**30:.1f} GiB): only a LoRA run (trainer.lora.rank > 0) can travel")
    step = f"{ckpt_dirname}/{ckpt.name}"
    weights = {k: (v.to(dtype) if v.is_floating_point() else v)
               for k, v in load_file(str(adapter / "adapter_model.safetensors")).items()}
    optim = torch.load(ckpt / "optimizer.pt", weights_only=False, map_location="cpu")
    schedule = io.BytesIO()
    torch.save({"scheduler": optim["scheduler"], "optim_steps": optim["optim_steps"]}, schedule)
    out = {f"{step}/{ADAPTER_DIR}/adapter_model.safetensors": save(weights),
           f"{step}/{ADAPTER_DIR}/adapter_config.json": (adapter / "adapter_config.json").read_bytes(),
           f"{step}/loop.pt": (ckpt / "loop.pt").read_bytes(),
           f"{step}/optimizer.pt": schedule.getvalue()}
    for name in ("config.json", "metrics.jsonl"):
        if (run_dir / name).exists():
            out[name] = (run_dir / name).read_bytes()
    return out


def pack(run_dir: str | Path, out_dir: str | Path, part_mib: float = PART_MIB, ckpt_dirname: str = "checkpoints",
         dtype: torch.dtype = torch.bfloat16) -> list[Path]:
    """The newest checkpoint of ``run_dir`` as ``out_dir/ckpt.tar.NN`` parts; returns them."""
    files = members(Path(run_dir), ckpt_dirname, dtype)
    manifest = {name: _sha(data) for name, data in files.items()}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [(MANIFEST, json.dumps(manifest, indent=1).encode()), *files.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob, size = buf.getvalue(), max(1, int(part_mib * 2**20))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(PREFIX + "*"):
        old.unlink()
    parts = []
    for i in range(0, len(blob), size):
        p = out / f"{PREFIX}{i // size + 1:02d}"
        p.write_bytes(blob[i:i + size])
        parts.append(p)
    step = next(n for n in files if n.endswith("/loop.pt")).split("/")[-2]
    print(f"[ckpt_carry] {step} of {run_dir}: {len(blob) / 2**20:.1f} MiB in {len(parts)} parts under {out} "
          f"(sha256 {_sha(blob)[:16]})", flush=True)
    return parts


def unpack(parts_dir: str | Path, run_dir: str | Path) -> Path:
    """Parts written by :func:`pack` back into ``run_dir``; returns the checkpoint directory."""
    parts = sorted(Path(parts_dir).glob(PREFIX + "*"))
    if not parts:
        raise SystemExit(f"[ckpt_carry] no {PREFIX}NN parts under {parts_dir}")
    numbers = [int(p.name[len(PREFIX):]) for p in parts]
    if numbers != list(range(1, len(parts) + 1)):
        raise SystemExit(f"[ckpt_carry] parts under {parts_dir} are {numbers}: one is missing")
    blob = b"".join(p.read_bytes() for p in parts)
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
            files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    except tarfile.TarError as e:
        raise SystemExit(f"[ckpt_carry] the parts under {parts_dir} do not form a whole tar ({e}): "
                         "a part is cut short or from another pack") from e
    manifest = json.loads(files.pop(MANIFEST))
    bad = sorted(n for n in manifest if _sha(files.get(n, b"")) != manifest[n])
    if bad or set(files) != set(manifest):
        raise SystemExit(f"[ckpt_carry] {parts_dir}: members differ from their manifest: {bad or sorted(files)}")
    run = Path(run_dir)
    for name, data in files.items():
        dest = run / name
        if os.path.isabs(name) or ".." in Path(name).parts:
            raise SystemExit(f"[ckpt_carry] refusing member {name!r}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    ckpt = run / next(n for n in files if n.endswith("/loop.pt")).rsplit("/", 1)[0]
    print(f"[ckpt_carry] {ckpt} rebuilt from {len(parts)} parts ({len(blob) / 2**20:.1f} MiB)", flush=True)
    return ckpt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ckpt_carry", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="RUN_DIR's newest checkpoint -> OUT_DIR/ckpt.tar.NN")
    p.add_argument("run_dir")
    p.add_argument("out_dir")
    p.add_argument("--part-mib", type=float, default=PART_MIB)
    p.add_argument("--checkpoint-dir", default="checkpoints", help="checkpoint.dir of the run")
    u = sub.add_parser("unpack", help="PARTS_DIR/ckpt.tar.NN -> RUN_DIR/<checkpoint>/")
    u.add_argument("parts_dir")
    u.add_argument("run_dir")
    a = ap.parse_args(argv)
    if a.cmd == "pack":
        pack(a.run_dir, a.out_dir, a.part_mib, a.checkpoint_dir)
    else:
        unpack(a.parts_dir, a.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
