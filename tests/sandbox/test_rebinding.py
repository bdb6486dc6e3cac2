"""An answer's C++ rebinds, through the Python C API, the runner's per-call helpers (the
red team's A34), or turns glibc's host allocation poison off itself (A35). CPU backend, real workers
and a real C++ build (one cold build: ~1 min on the 2-core box); bench/redteam.py runs the same
answers on cuda. At bc7aee1 A34 was credited (correct, 1.9x over the honest answer's speedup on this
box, no flag) and A35 passed as correct."""
from __future__ import annotations

import pytest
import pytest_asyncio

from sandbox.pool import SandboxPool
from tests.sandbox import redteam as rt

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    s = rt.Site(tmp_path_factory.mktemp("rebinding"))
    s.start()
    yield s
    s.close()
    rt.cleanup_shm(s)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(site):
    async with SandboxPool(rt.config(site.cache)) as p:
        await rt.prime(p, tasks=("relu",))
        yield p


@pytest.mark.parametrize("name", ["A34_cpp_rebinds_the_runners_helpers", "A35_turns_the_host_poison_off"])
async def test_rebinding_earns_nothing(name, pool, site):
    with rt.one_core():
        o = await rt.evaluate(pool, site, name)
    found = rt.problems(o, site)
    after = o.follow
    print(f"\n{name}: {rt.got(o)} | the correct answer after it: speedup {after.speedup} | "
          f"{(o.result.error or '')[:200]}")
    print("\n".join(line for line in (o.result.log_tail or "").splitlines() if "REDTEAM" in line))
    assert not found, f"{name}: got {rt.got(o)}: {found}"
