"""Each confinement measure of sandbox.isolation, for real: a fresh ``python -c`` applies it and
then tries what it must forbid, reporting one JSON line; where cheap, the same attempt without the
measure shows that it is the measure that forbids it. CPU only, no compiler."""
from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from sandbox import isolation, seccomp
from sandbox.read_roots import PROJECT_ROOT

PRELUDE = """
import ctypes, errno, json, os, socket, sys
from sandbox import isolation
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
def attempt(f):
    try:
        r = f()
        return ["ok", repr(r)[:300]]
    except OSError as e:
        return ["err", e.errno]
def sys_call(*args):
    r = libc.syscall(*[ctypes.c_long(a) for a in args])
    return ["ok", r] if r >= 0 else ["err", ctypes.get_errno()]
def caps():
    with open("/proc/self/status") as f:
        return {k: int(v, 16) for k, _, v in (ln.partition(":") for ln in f) if k.startswith("Cap")}
"""
OK = "ok"


def run(body: str, timeout: float = 60) -> dict:
    """``body`` in a fresh interpreter (environment as the pool gives a worker: PYTHONPATH is the
    checkout); it fills ``out``, which comes back."""
    code = PRELUDE + textwrap.dedent(body) + "\nprint('\\n' + json.dumps(out))\n"
    env = {**os.environ, "PYTHONPATH": PROJECT_ROOT, "PYTHONNOUSERSITE": "1"}
    p = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def denied(result, *codes: int) -> bool:
    return result[0] == "err" and (not codes or result[1] in codes)


def needs_landlock(abi: int = 1) -> None:
    if isolation.landlock_abi() < abi:
        pytest.skip(f"Landlock ABI {abi} not available (have {isolation.landlock_abi()})")


def needs_namespaces(*names: str) -> None:
    r = run(f"out['made'] = isolation.unshare_namespaces(network=False, pids=False, mounts={'mountns' in names}, "
            f"uts={'utsns' in names}, ipc={'ipcns' in names})")
    if not set(names) <= set(r["made"]):
        pytest.skip(f"cannot unshare {names} here")


def needs_seccomp() -> None:
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the seccomp filter is written for x86_64 and aarch64 only")


def confine_reads(work: Path) -> str:
    return f"""
out['applied'] = isolation.restrict_access(isolation.default_read_roots([{str(work)!r}]), [{str(work)!r}, '/dev/shm'],
    isolation.default_device_paths(), block_tcp=True, scope=True, proc_dir=f"/proc/{{os.getpid()}}/task")
"""


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "secret.txt").write_text("token")
    return home, work


# --- Landlock: reads ------------------------------------------------------------------------------

def test_default_read_roots_hold_the_toolchain_but_not_the_checkout_home_or_tmp(tmp_path):
    roots = isolation.default_read_roots([str(tmp_path)])

    def covered(path: str) -> bool:
        real = os.path.realpath(path)
        return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)
    root = PROJECT_ROOT
    assert covered(os.path.join(root, "sandbox", "isolation.py")) and covered(str(tmp_path))
    assert not covered(root) and not covered(os.path.join(root, ".git")) and not covered(os.path.join(root, "tests"))
    assert not covered(os.path.join(root, "pyproject.toml"))
    if os.path.realpath(sys.prefix).startswith(root + "/"):
        assert covered(sys.prefix)  # the venv in the checkout, and only it
    assert covered(sys.base_prefix) and covered(os.__file__) and covered("/usr/bin")
    for path in ("/root", "/home", "/tmp", "/run", "/var", "/etc", "/etc/shadow", "/etc/ssh", "/"):
        assert not covered(path) or os.path.realpath(path) == os.path.realpath(str(tmp_path)), path
    assert covered("/etc/passwd") and covered("/etc/ld.so.cache")
    assert not covered("/dev/vda") and not covered("/dev/kmsg") and covered("/dev/null")


def test_reads_are_confined_to_the_read_roots(dirs):
    needs_landlock()
    home, work = dirs
    probe = f"""
out['secret'] = attempt(lambda: open({str(home / 'secret.txt')!r}).read())
out['shadow'] = attempt(lambda: open('/etc/shadow').read())
out['list_tmp'] = attempt(lambda: os.listdir('/tmp'))
out['list_root'] = attempt(lambda: os.listdir('/root'))
out['list_checkout'] = attempt(lambda: os.listdir({PROJECT_ROOT!r}))
out['write_home'] = attempt(lambda: open({str(home / 'planted')!r}, 'w'))
"""
    free = run(probe)
    assert free["secret"] == [OK, "'token'"] and free["list_tmp"][0] == OK  # without the measure
    (home / "planted").unlink()
    r = run(confine_reads(work) + probe + f"""
import importlib.util
spec = importlib.util.find_spec('torch')  # not imported: only its files are read
out['torch_init'] = attempt(lambda: len(open(spec.origin).read()) > 0 if spec else 'no torch')
stdio_h = '/usr/include/stdio.h'
out['stdio_h'] = attempt(lambda: len(open(stdio_h).read()) if os.path.exists(stdio_h) else 1)
out['passwd'] = attempt(lambda: len(open('/etc/passwd').read()))
import xml.dom.minidom  # a stdlib package nobody imported before the confinement
out['xml'] = xml.dom.minidom.parseString('<a/>').documentElement.tagName
out['work'] = attempt(lambda: open({str(work / 'x')!r}, 'w').write('1'))
out['sandbox_src'] = attempt(lambda: len(open(isolation.__file__).read()) > 0)
""")
    assert {"landlock_fs", "landlock_read"} <= set(r["applied"]), r
    for key in ("secret", "shadow", "list_tmp", "list_root", "list_checkout", "write_home"):
        assert denied(r[key], errno.EACCES), (key, r[key])
    for key in ("torch_init", "stdio_h", "passwd", "work", "sandbox_src"):
        assert r[key][0] == OK, (key, r[key])
    assert r["xml"] == "a"
    assert not (home / "planted").exists()


def test_restrict_writes_keeps_its_old_meaning(dirs):
    needs_landlock()
    home, work = dirs
    r = run(f"""
out['applied'] = isolation.restrict_writes([{str(work)!r}], ['/dev'], block_tcp=True)
out['read_home'] = attempt(lambda: open({str(home / 'secret.txt')!r}).read())
out['write_home'] = attempt(lambda: open({str(home / 'planted')!r}, 'w'))
out['write_work'] = attempt(lambda: open({str(work / 'x')!r}, 'w').write('1'))
""")
    assert "landlock_fs" in r["applied"] and "landlock_read" not in r["applied"], r
    assert r["read_home"] == [OK, "'token'"] and denied(r["write_home"], errno.EACCES) and r["write_work"][0] == OK


def test_only_the_listed_device_files_can_be_opened(dirs):
    needs_landlock()
    _, work = dirs
    disks = [p for p in ("/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/xvda") if os.path.exists(p)]
    r = run(confine_reads(work) + f"""
out['kmsg'] = attempt(lambda: open('/dev/kmsg', 'w').write('sandbox test\\n')) if os.path.exists('/dev/kmsg') else None
out['disk'] = attempt(lambda: open({disks[0]!r}, 'rb').read(512)) if {bool(disks)} else None
out['null'] = attempt(lambda: open('/dev/null', 'w').write('x'))
out['urandom'] = attempt(lambda: len(open('/dev/urandom', 'rb').read(8)))
out['list_dev'] = attempt(lambda: 'null' in os.listdir('/dev'))
""")
    if r["kmsg"] is None:
        pytest.skip("no /dev/kmsg")
    assert denied(r["kmsg"], errno.EACCES), r
    assert r["disk"] is None or denied(r["disk"], errno.EACCES), r
    assert r["null"][0] == OK and r["urandom"] == [OK, "8"] and r["list_dev"] == [OK, "True"], r


# --- sockets --------------------------------------------------------------------------------------

def _listener(address) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(address)
    s.listen(4)
    s.setblocking(False)
    return s


def _connections(s: socket.socket) -> int:
    n = 0
    while True:
        try:
            s.accept()[0].close()
            n += 1
        except BlockingIOError:
            return n


def test_a_unix_socket_listener_of_the_host_cannot_be_reached(tmp_path):
    needs_seccomp()
    path = str(tmp_path / "l.sock")
    probe = f"""
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect({path!r})
    return 'connected'
out['connect'] = attempt(connect)
out['dgram'] = attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
out['pair'] = attempt(lambda: len(socket.socketpair()))
out['inet'] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
"""
    listener = _listener(path)
    try:
        assert run(probe)["connect"] == [OK, "'connected'"] and _connections(listener) == 1  # without it
        r = run("out['applied'] = isolation.install_filter()\n" + probe)
        assert r["applied"] == ["seccomp"], r
        # the filter fails every connect() as if nothing listened (CUDA copes with that, not with a
        # refused socket()), and refuses the datagram kind, which could send to a path unconnected
        assert denied(r["connect"], errno.ENOENT, errno.EPERM) and denied(r["dgram"], errno.EPERM), r
        assert r["pair"] == [OK, "2"] and r["inet"][0] == OK, r
        assert _connections(listener) == 0
    finally:
        listener.close()


def test_an_abstract_unix_socket_outside_the_domain_cannot_be_reached():
    needs_landlock(6)
    name = f"\0kbsandbox-test-{uuid.uuid4().hex}"
    probe = f"""
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect({name!r})
    return 'connected'
out['connect'] = attempt(connect)
"""
    listener = _listener(name)
    try:
        assert run(probe)["connect"] == [OK, "'connected'"] and _connections(listener) == 1
        r = run("out['applied'] = isolation.restrict_access(['/'], [], [], block_tcp=False, scope=True)\n" + probe)
        assert "landlock_signal_scope" in r["applied"] and denied(r["connect"], errno.EPERM), r
        if platform.machine() in ("x86_64", "aarch64"):
            assert denied(run("isolation.install_filter()\n" + probe)["connect"], errno.ENOENT, errno.EPERM)
        assert _connections(listener) == 0
    finally:
        listener.close()


# --- seccomp ------------------------------------------------------------------------------------

def test_the_filter_assembles_for_both_architectures():
    for machine in ("x86_64", "aarch64"):
        prog = seccomp.build_program(machine)
        rets = {k for code, _, _, k in prog if code == 0x06}
        assert 40 < len(prog) < 255 and prog[-1][0] == 0x06
        assert {0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS} <= rets


def test_seccomp_denies_the_listed_calls_and_leaves_threads_and_processes_working(tmp_path):
    needs_seccomp()
    x86 = platform.machine() == "x86_64"
    nr = {"unshare": 272 if x86 else 97, "mount": 165 if x86 else 40, "ptrace": 101 if x86 else 117,
          "io_uring_setup": 425, "bpf": 321 if x86 else 280, "clone": 56 if x86 else 220,
          "sethostname": 170 if x86 else 161, "getpid": 39 if x86 else 172}
    r = run(f"""
out['applied'] = isolation.install_filter()
out['status'] = [ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('Seccomp:')]
out['netlink'] = attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
out['packet'] = attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
out['unshare'] = sys_call({nr['unshare']}, 0x04000000)
out['mount'] = sys_call({nr['mount']}, 0, 0, 0, 0, 0)
out['ptrace'] = sys_call({nr['ptrace']}, 0, 0, 0, 0)
out['io_uring'] = sys_call({nr['io_uring_setup']}, 1, 0)
out['bpf'] = sys_call({nr['bpf']}, 0, 0, 0)
out['clone_newuser'] = sys_call({nr['clone']}, 0x10000000 | 17, 0, 0, 0, 0)
out['sethostname'] = sys_call({nr['sethostname']}, 0, 0)
out['x32'] = sys_call(0x40000000 | {nr['getpid']}) if {x86} else ['err', errno.EPERM]
out['fifo'] = attempt(lambda: os.mkfifo({str(tmp_path / 'fifo')!r}))
out['nice_self'] = attempt(lambda: os.nice(1))  # lowering its own priority is harmless
out['nice_user'] = attempt(lambda: os.setpriority(os.PRIO_USER, 65533, 19))  # every process of a uid
child = os.fork()
if child == 0:
    import time; time.sleep(5); os._exit(0)
out['nice_other'] = attempt(lambda: os.setpriority(os.PRIO_PROCESS, child, 19))
os.kill(child, 9); os.waitpid(child, 0)
import threading, subprocess
seen = []
ts = [threading.Thread(target=lambda: seen.append(1)) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
out['threads'] = len(seen)
out['subprocess'] = subprocess.run(['/bin/echo', 'hi'], capture_output=True, text=True).stdout
pid = os.fork()
if pid == 0:
    os._exit(7)
out['fork'] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
""")
    assert r["applied"] == ["seccomp"] and r["status"] == ["2"], r
    for key in ("netlink", "packet", "unshare", "mount", "ptrace", "io_uring", "bpf", "clone_newuser",
                "sethostname", "x32", "fifo", "nice_user", "nice_other"):
        assert denied(r[key], errno.EPERM), (key, r[key])
    assert r["threads"] == 4 and r["subprocess"] == "hi\n" and r["fork"] == 7 and r["nice_self"][0] == OK, r


# --- privileges and CPUs -----------------------------------------------------------------------

def test_drop_privileges_leaves_no_capability_priority_or_device_nodes(tmp_path):
    needs_namespaces("utsns")  # sethostname is tried in a UTS namespace of its own
    if os.geteuid() != 0:
        pytest.skip("the control needs root")
    probe = f"""
out['hostname'] = attempt(lambda: socket.sethostname('sandbox-test'))
def fifo():
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
out['fifo'] = attempt(fifo)
out['mknod'] = attempt(lambda: os.mknod({str(tmp_path)!r} + '/dev' + str(os.getpid()), 0o20600, os.makedev(1, 3)))
out['nice'] = attempt(lambda: os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) - 1))
out['caps'] = caps()
import subprocess  # execve as uid 0 gives a process every capability, unless they are all gone
out['child_caps'] = [ln.split()[1] for ln in subprocess.run(['/bin/cat', '/proc/self/status'],
    capture_output=True, text=True).stdout.splitlines() if ln.startswith(('CapEff', 'CapPrm'))]
"""
    setup = "isolation.unshare_namespaces(network=False, pids=False, mounts=False, uts=True)\n"
    free = run(setup + probe)
    assert free["hostname"][0] == OK and free["mknod"][0] == OK and free["caps"]["CapEff"], free
    r = run(setup + "out['applied'] = isolation.drop_privileges(None)\n" + probe)
    assert {"caps_dropped", "no_new_privs", "rlimit_rtprio", "rlimit_nice"} <= set(r["applied"]), r
    assert r["caps"]["CapEff"] == r["caps"]["CapPrm"] == r["caps"]["CapBnd"] == r["caps"]["CapAmb"] == 0
    assert r["child_caps"] == ["0000000000000000"] * 2, r
    for key in ("hostname", "fifo", "mknod", "nice"):
        assert denied(r[key], errno.EPERM, errno.EACCES), (key, r[key])


def test_threads_stay_on_the_one_allowed_cpu_and_cannot_widen_it():
    needs_seccomp()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: no wider set to try")
    probe = f"""
import threading
seen = []
def worker():  # as an OpenMP runtime's thread would: look at, then try to widen, its CPUs
    seen.append([sorted(os.sched_getaffinity(0)), attempt(lambda: os.sched_setaffinity(0, {cpus}))])
ts = [threading.Thread(target=worker) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
out['threads'] = seen
out['main'] = attempt(lambda: os.sched_setaffinity(0, {cpus}))
"""
    widened = run(f"out['applied'] = isolation.drop_privileges([{cpus[0]}])\n" + probe)
    assert "cpu_affinity" in widened["applied"] and widened["main"][0] == OK  # no filter: it can widen
    r = run(f"out['applied'] = isolation.drop_privileges([{cpus[0]}]) + isolation.install_filter()\n" + probe)
    assert {"cpu_affinity", "seccomp"} <= set(r["applied"]), r
    assert len(r["threads"]) == 4
    for affinity, widen in r["threads"]:
        assert affinity == [cpus[0]] and denied(widen, errno.EPERM), r["threads"]
    assert denied(r["main"], errno.EPERM)


# --- namespaces and private storage ----------------------------------------------------------------

def test_uts_and_ipc_namespaces(tmp_path):
    needs_namespaces("utsns", "ipcns")
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x4B420000 | (os.getpid() & 0xFFFF)
    shmid = libc.shmget(key, 4096, 0o1600)  # IPC_CREAT | 0600
    if shmid < 0:
        pytest.skip("no System V shared memory")
    host = socket.gethostname()
    probe = f"out['shm'] = 'found' if libc.shmget({key}, 0, 0) >= 0 else errno.errorcode[ctypes.get_errno()]\n"
    try:
        assert run(probe)["shm"] == "found"
        r = run("out['made'] = isolation.unshare_namespaces(False, False, False, uts=True, ipc=True)\n"
                "out['hostname'] = attempt(lambda: socket.sethostname('sandbox-test'))\n" + probe)
        assert r["made"] == ["utsns", "ipcns"] and r["hostname"][0] == OK and r["shm"] == "ENOENT", r
        assert socket.gethostname() == host
        assert isolation.unshare_namespaces(network=False, pids=False) == []  # the old signature
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


def test_a_private_size_limited_dev_shm():
    needs_namespaces("mountns")
    planted = Path("/dev/shm") / f"kbsandbox-{uuid.uuid4().hex}"
    planted.write_text("host")
    mine = f"/dev/shm/mine-{uuid.uuid4().hex}"
    try:
        r = run(f"""
out['made'] = isolation.unshare_namespaces(network=False, pids=False, mounts=True)
out['applied'] = isolation.mount_private_shm(1 << 20, 8)
out['listing'] = os.listdir('/dev/shm')
st = os.statvfs('/dev/shm')
out['size'] = st.f_blocks * st.f_frsize
out['mode'] = oct(os.stat('/dev/shm').st_mode & 0o7777)
out['big'] = attempt(lambda: open('/dev/shm/big', 'wb').write(b'x' * (2 << 20)))
os.remove('/dev/shm/big')
open({mine!r}, 'w').write('sandbox')
def many():
    for i in range(20):
        open(f'/dev/shm/f{{i}}', 'w').close()
out['inodes'] = attempt(many)
""")
        assert r["applied"] == ["private_shm"] and r["listing"] == [] and r["size"] == 1 << 20, r
        assert r["mode"] == "0o1777" and denied(r["big"], errno.ENOSPC) and denied(r["inodes"], errno.ENOSPC), r
        assert planted.read_text() == "host" and not os.path.exists(mine)  # the host's is untouched
        # a mount namespace this module did not make (the host's, say) is never mounted over
        refused = run("libc.unshare(0x00020000)\nout['applied'] = isolation.mount_private_shm(1 << 20, 8)\n")
        assert refused["applied"] == []
    finally:
        planted.unlink()


def test_a_quota_on_an_empty_scratch_dir_and_none_on_a_full_one(tmp_path):
    needs_namespaces("mountns")
    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir()
    full.mkdir()
    (full / "candidate.py").write_text("x")
    r = run(f"""
isolation.unshare_namespaces(network=False, pids=False, mounts=True)
os.chdir({str(empty)!r})
out['applied'] = isolation.mount_quota_dir({str(empty)!r}, 1 << 20, 64)
out['big'] = attempt(lambda: open('big', 'wb').write(b'x' * (2 << 20)))  # relative: the cwd moved too
out['small'] = attempt(lambda: open({str(empty / 'small')!r}, 'wb').write(b'x'))
out['full'] = isolation.mount_quota_dir({str(full)!r}, 1 << 20, 64)
out['kept'] = os.listdir({str(full)!r})
""")
    assert r["applied"] == ["dir_quota"] and denied(r["big"], errno.ENOSPC), r
    assert r["full"] == [] and r["kept"] == ["candidate.py"], r
    assert os.listdir(empty) == []  # it lived in the step's namespace only


def test_the_whole_stack_in_the_documented_order(dirs):
    needs_landlock()
    needs_seccomp()
    needs_namespaces("mountns", "utsns", "ipcns")
    home, work = dirs
    r = run(f"""
applied = isolation.unshare_namespaces(network=True, pids=False, mounts=True, uts=True, ipc=True)
applied += isolation.mount_private_shm(8 << 20, 256)
applied += isolation.mount_quota_dir({str(work)!r}, 8 << 20, 256)
os.makedirs({str(work / 'tmp')!r})
{confine_reads(work).strip()}
applied += out.pop('applied')
applied += isolation.drop_privileges([sorted(os.sched_getaffinity(0))[0]])  # after Landlock
applied += isolation.install_filter()  # last: it denies sched_setaffinity
out['applied'] = applied
out['secret'] = attempt(lambda: open({str(home / 'secret.txt')!r}).read())
out['caps'] = caps()
out['hostname'] = attempt(lambda: socket.sethostname('x'))
out['unix'] = attempt(lambda: socket.socket(socket.AF_UNIX).connect('/run/systemd/private'))
out['shm'] = attempt(lambda: open('/dev/shm/t', 'w').write('1'))
import tempfile
os.environ['TMPDIR'] = {str(work / 'tmp')!r}
out['tmp'] = attempt(lambda: tempfile.NamedTemporaryFile(dir=None).name)
""")
    want = {"netns", "mountns", "utsns", "ipcns", "private_shm", "dir_quota", "landlock_fs", "landlock_read",
            "landlock_tcp", "cpu_affinity", "rlimit_rtprio", "caps_dropped", "no_new_privs", "seccomp"}
    assert want <= set(r["applied"]), sorted(want - set(r["applied"]))
    assert denied(r["secret"], errno.EACCES) and not any(r["caps"].values())
    assert denied(r["hostname"], errno.EPERM) and denied(r["unix"], errno.ENOENT, errno.EPERM)
    assert r["shm"][0] == OK and r["tmp"][0] == OK, r
