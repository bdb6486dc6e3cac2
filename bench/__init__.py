"""Benchmarks: each ``python -m bench.<name> [--out FILE]`` prints a table and writes JSON.

They are scripts, not tests: numbers go to docs/performance.md with the machine and the command.
"""
