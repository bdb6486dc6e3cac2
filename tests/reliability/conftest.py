"""Fixtures for the reliability tests: the sandbox tests' small config for this 2-core machine."""
from tests.sandbox.conftest import sandbox_cfg  # noqa: F401  (re-exported fixture)
