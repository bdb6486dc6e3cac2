"""The wheel: carries conf/ (as pipeline/conf), LICENSE, console scripts; unpacked outside the
repository (what an install puts in site-packages), its entry point composes the main config."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the checkout's files (a build in place would leave build/ behind)."""
    tmp = tmp_path_factory.mktemp("wheel")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    src = tmp / "src"
    for f in files:
        if f.startswith(("tests/", "docs/")) or not (ROOT / f).is_file():
            continue
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        (src / f).write_bytes((ROOT / f).read_bytes())
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = (tmp / "dist").glob("kernel_rl_pipeline-*.whl")
    return whl


def test_wheel_carries_configs_license_and_scripts(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "pipeline/conf/config.yaml" in names and "pipeline/conf/eval.yaml" in names
    assert "pipeline/conf/experiment/kernel_multiturn.yaml" in names
    assert any(n.endswith("licenses/LICENSE") for n in names), names[-10:]
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: MIT" in text and "Classifier: Programming Language :: Python :: 3" in text
    scripts = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for s in ("kernel-rl-train = pipeline.main:cli", "kernel-rl-evaluate = pipeline.evaluate:main"):
        assert s in scripts


def test_installed_wheel_composes_outside_the_repository(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel installed is its files unpacked
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    code = ("import pipeline.conf_files as c, sys; print(c.CONF_DIR); "
            "sys.argv=['kernel-rl-train','--cfg','job','+experiment=kernel_multiturn']; "
            "import pipeline.main as m; m.main()")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == str(site / "pipeline" / "conf")
    assert "name: kernel_multiturn" in proc.stdout
