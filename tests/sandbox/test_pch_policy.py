"""When the pool builds a precompiled header (a real g++ run; a bogus flag makes it fail fast)."""
import asyncio
import dataclasses

from sandbox.pool import EvalPool


async def test_a_flag_set_gets_a_pch_build_on_its_second_use_only_once(sandbox_cfg, tmp_path):
    cfg = dataclasses.replace(sandbox_cfg, precompiled_header=True, pch_min_builds=2, cache_dir=str(tmp_path))
    flags = ["-fno-such-flag-for-this-test"]
    async with EvalPool(cfg) as pool:
        pool._schedule_pch(flags)
        assert not pool._pch_building
        pool._schedule_pch(flags)
        pool._schedule_pch(flags)
        assert len(pool._pch_building) == 1
        await asyncio.gather(*pool._pch_building.values())
        assert pool.stats().get("pch_failed") == 1.0 and "pch_built" not in pool.stats()
    assert not [p for p in (tmp_path / "pch").iterdir() if not p.name.startswith(".")]
