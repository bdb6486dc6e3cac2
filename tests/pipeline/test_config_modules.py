"""Where schemas live: every group's dataclass in a config module (``pipeline/config.py`` the
root, ``pipeline/<area>_config.py``, ``<package>/config.py``), and a config module imports no
entry point (``python -m pipeline.<name>``) and no runtime module of its own area, so each one
imports first in a fresh interpreter: a circle through an entry point fails here."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# each imported first in line: the interpreter forgets the project's modules between two
PROBE = """
import json, sys
out = {}
for name in sys.argv[1:]:
    for m in [m for m in sys.modules if m.split(".")[0] in ("pipeline", "rewards", "sandbox")]:
        del sys.modules[m]
    __import__(name)
    out[name] = sorted(m for m in sys.modules if m.split(".")[0] in ("pipeline", "rewards", "sandbox"))
print(json.dumps(out))
"""


def config_modules() -> list[str]:
    files = [ROOT / "pipeline" / "config.py", *sorted((ROOT / "pipeline").glob("*_config.py")),
             *sorted((ROOT / "pipeline").glob("*/config.py")), ROOT / "rewards" / "config.py",
             ROOT / "sandbox" / "config.py"]
    return [".".join(f.relative_to(ROOT).with_suffix("").parts) for f in files]


def entry_points() -> set[str]:
    return {f"pipeline.{f.stem}" for f in (ROOT / "pipeline").glob("*.py")
            if 'if __name__ == "__main__"' in f.read_text()}


def test_every_schema_dataclass_is_in_a_config_module():
    from dataclasses import fields, is_dataclass

    from pipeline.config import Config

    def walk(cls: type) -> list[type]:
        found = [cls]
        for f in fields(cls):
            if isinstance(f.type, type) and is_dataclass(f.type):
                found += walk(f.type)
            elif isinstance(f.type, str):
                t = sys.modules[cls.__module__].__dict__.get(f.type)
                if isinstance(t, type) and is_dataclass(t):
                    found += walk(t)
        return found

    schemas = walk(Config)
    assert len(schemas) > 15  # the root, its groups and their nested schemas were all reached
    modules = set(config_modules())
    outside = {c.__qualname__: c.__module__ for c in schemas if c.__module__ not in modules}
    assert not outside, f"schemas outside a config module: {outside}"


def test_each_config_module_imports_first_without_an_entry_point_or_its_runtime_module():
    names = config_modules()
    assert {"pipeline.config", "pipeline.sft_config", "pipeline.loop_config"} <= set(names)
    proc = subprocess.run([sys.executable, "-c", PROBE, *names], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    mains = entry_points()
    assert {"pipeline.main", "pipeline.sft", "pipeline.evaluate"} <= mains
    for name, modules in loaded.items():
        assert not mains & set(modules), f"{name} imports the entry point(s) {mains & set(modules)}"
        if name.startswith("pipeline.") and name.endswith("_config"):
            runtime = name.removesuffix("_config")  # pipeline.sft_config must not import pipeline.sft
            assert runtime not in modules, f"{name} imports {runtime}"
