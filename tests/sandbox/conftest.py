"""Shared fixtures for the sandbox tests: a config for this 2-core machine, fixture sources, the
split build's trusted parts."""
from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import split_build
from sandbox.config import SandboxConfig, load_default_config

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sandbox"


def fixture_source(relative: str) -> str:
    return (FIXTURES / relative).read_text()


@pytest.fixture
def sandbox_cfg(kernel_cache_dir: str) -> SandboxConfig:
    # Small numbers: the suite runs on 2 cores; builds are shared through the session cache.
    return load_default_config(cache_dir=kernel_cache_dir, precompiled_header=False, split_build=False,
                               run_timeout_s=20, compile_timeout_s=400, warmup_runs=1, timing_runs=5, correctness_trials=3,
                               memory_limit_bytes=4 * 2**30, max_processes=64, max_concurrent=2,
                               compile_workers=2)


@pytest.fixture(scope="session")
def split_cache(tmp_path_factory) -> Path:
    """A pool cache whose split dir holds the split build's trusted parts (the runtime library and
    the ``min`` PCH of every flag set the corpus's C++ answers use), built once for the session:
    minutes on 2 cores, which tests/sandbox/test_split_build.py and the build_speed bench in
    tests/sandbox/test_build_speed.py would otherwise each pay. Its ``builds`` dir is
    test_split_build's alone (it counts the decisions there)."""
    from bench.build_speed import templates

    cache = tmp_path_factory.mktemp("split_cache")
    for flags in sorted({tuple(c) for *_, c in templates()}):
        split_build.build_trusted(cache / "split", list(flags))
    return cache
