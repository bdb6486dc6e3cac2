"""Shared fixtures for the sandbox tests: a config for this 2-core machine, fixture sources."""
from __future__ import annotations

from pathlib import Path

import pytest

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
