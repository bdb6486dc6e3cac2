"""Red team of the second evaluation protocol (docs/sandbox.md), CPU backend, real workers: the
answers of tests/sandbox/redteam.py, each followed by the task's correct answer in the same pool
(one pool for the module). A = run-time reward hacks, B = reads of what lies outside the read roots,
C = escapes. Every answer must end without credit (an error kind, or correct and timed honestly) and
with no planted secret in its verdict; after each group the host holds nothing of the answers (no
marker file, no connection seen, nothing in /dev/shm, no work dir, no process). An answer that shows
a hole is xfail(strict=True) with the hole as its reason. bench/redteam.py runs the same answers on any
backend and prints the table."""
from __future__ import annotations

import pytest
import pytest_asyncio

from sandbox.pool import SandboxPool
from tests.sandbox import redteam as rt

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    # the planted secrets and the pool's cache (so every work dir) under one tmp dir
    s = rt.Site(tmp_path_factory.mktemp("redteam"))
    s.start()
    env = pytest.MonkeyPatch()
    for name, value in s.env.items():  # the driver's secrets: none may reach a verdict
        env.setenv(name, value)
    yield s
    env.undo()
    s.close()
    rt.cleanup_shm(s)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(site):
    async with SandboxPool(rt.config(site.cache)) as p:
        await rt.prime(p)
        yield p


async def _group(pool, site, group):
    return await rt.run_group(pool, site, rt.names(group))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hacks(pool, site):
    return await _group(pool, site, "A")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def reads(pool, site):
    return await _group(pool, site, "B")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def escapes(pool, site):
    return await _group(pool, site, "C")


def _cases(group):
    return [pytest.param(n, id=n, marks=pytest.mark.xfail(strict=True, reason=rt.ANSWERS[n].hole))
            if rt.ANSWERS[n].hole else pytest.param(n, id=n) for n in rt.names(group)]


def _check(outcomes, site, name):
    o = outcomes[name]
    found = rt.problems(o, site)
    assert not found, f"{name} ({rt.ANSWERS[name].tries}): got {rt.got(o)}: {found}"


@pytest.mark.parametrize("name", _cases("A"))
async def test_a_run_time_hack_earns_nothing(name, hacks, site):
    _check(hacks, site, name)


async def test_the_hacks_left_the_host_unchanged(hacks, site):
    assert not site.host_problems()


@pytest.mark.parametrize("name", _cases("B"))
async def test_a_read_outside_the_read_roots_is_denied(name, reads, site):
    _check(reads, site, name)


async def test_the_reads_left_the_host_unchanged(reads, site):
    assert not site.host_problems()


@pytest.mark.parametrize("name", _cases("C"))
async def test_an_escape_fails(name, escapes, site):
    _check(escapes, site, name)


async def test_the_escapes_left_the_host_unchanged(escapes, site):
    assert not site.host_problems()
    assert site.connections == 0 and not site.marker.exists()


async def test_the_red_team_covers_every_kind_of_attack():
    counts = {g: len(rt.names(g)) for g in "ABC"}
    assert counts["A"] >= 20 and counts["B"] >= 8 and counts["C"] >= 6, counts
    assert all(a.backend == "cpu" for a in rt.ANSWERS.values())
    prefixes = {n[:3] for n in rt.ANSWERS}
    for item, answers in rt.COVERS.items():
        assert answers and set(answers) <= prefixes, (item, sorted(set(answers) - prefixes))
    # the reads go through Python, C++ (a built extension) and the build step
    assert "load_inline" in rt.ANSWERS["B15_cpp_extension_reads_and_raises"].source
