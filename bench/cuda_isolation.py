"""Which sandbox measure, alone, keeps CUDA from starting: one child process per measure.

The sandbox's GPU run steps failed on the lent H200 at ``cudaGetDeviceCount()`` (error 304). The
pool's probe (sandbox/gpu_probe.py) steps isolation down until the device starts; this bench says
which measure is to blame, so the fix can be the narrowest one. Each row applies the measures it
names (with the functions the worker uses, in the worker's order) to a fresh child, then runs the
pool's own CUDA probe.

    python -m bench.cuda_isolation --out bench/baselines/h200/cuda_isolation.json
"""
from __future__ import annotations

import concurrent.futures
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

from bench.common import parser, progress, report

# name -> measures applied in the child ("env" = the sandbox's scrubbed environment)
ROWS = {
    "parent_env": [],
    "scrubbed_env": ["env"],
    "rlimits": ["env", "rlimits"],
    "rlimit_as_16g": ["env", "rlimit_as"],
    "netns": ["env", "netns"],
    "mountns": ["env", "mountns"],
    "pidns+private_proc": ["env", "pidns", "mountns", "private_proc"],
    "landlock_fs": ["env", "landlock"],
    "landlock_fs+scope": ["env", "landlock", "scope"],
    "full (as the worker)": ["env", "rlimits", "netns", "pidns", "mountns", "private_proc", "landlock", "scope"],
    # the worker's rule since 2026-12-03: existing files beneath its own /proc/<pid>/task writable
    "landlock_fs+own_threads": ["env", "landlock", "own_threads"],
    "full+own_threads": ["env", "rlimits", "netns", "pidns", "mountns", "private_proc", "landlock", "scope",
                         "own_threads"],
    # where under Landlock does the driver need to write? (each adds one tree with every write right)
    "landlock_fs+w:/dev": ["env", "landlock", "w:/dev"],
    "landlock_fs+w:/dev/nvidia-caps": ["env", "landlock", "w:/dev/nvidia-caps"],
    "landlock_fs+w:/proc": ["env", "landlock", "w:/proc"],
    "landlock_fs+w:/sys": ["env", "landlock", "w:/sys"],
    "landlock_fs+w:/tmp": ["env", "landlock", "w:/tmp"],
    "landlock_fs+w:/": ["env", "landlock", "w:/"],
    # a second process initialises CUDA while another one holds a context (the harness after its candidate)
    "second_context": ["env", "second_ctx"],
    # the second protocol's runner measures (2026-12-04), one at a time, then all
    "seccomp": ["env", "seccomp"],
    "seccomp+unix_sockets": ["env", "seccomp", "unix_ok"],
    "seccomp+mknod": ["env", "seccomp", "mknod_ok"],
    "privileges": ["env", "privileges"],
    "affinity": ["env", "affinity"],
    "utsns": ["env", "utsns"],
    "ipcns": ["env", "ipcns"],
    "landlock_read": ["env", "landlock_read"],
    "runner (as the second protocol)": ["env", "rlimits", "netns", "pidns", "mountns", "private_proc", "utsns",
                                        "ipcns", "landlock_read", "privileges", "seccomp"],
    "runner-seccomp": ["env", "rlimits", "netns", "pidns", "mountns", "private_proc", "utsns", "ipcns",
                       "landlock_read", "privileges"],
    "runner-privileges": ["env", "rlimits", "netns", "pidns", "mountns", "private_proc", "utsns", "ipcns",
                          "landlock_read", "seccomp"],
}


def child(measures: list[str], workdir: str) -> None:
    """Runs in the child: apply ``measures``, then the CUDA probe; prints one JSON line."""
    from sandbox import isolation
    from sandbox.gpu_probe import CUDA_PROBE_SRC
    applied: list[str] = []
    if "rlimits" in measures:
        applied += isolation.set_rlimits(None, 1024, 512, 3600, 4 << 30)
    if "rlimit_as" in measures:
        applied += isolation.set_rlimits(16 << 30, 1 << 16, 0, 3600, 4 << 30)
    applied += isolation.unshare_namespaces(network="netns" in measures, pids="pidns" in measures,
                                            mounts="mountns" in measures, uts="utsns" in measures,
                                            ipc="ipcns" in measures)
    if "pidns" in applied and os.fork() != 0:  # the namespace's first process runs the rest
        _, status = os.wait()
        os._exit(os.waitstatus_to_exitcode(status))
    if "private_proc" in measures and {"pidns", "mountns"} <= set(applied):
        applied += isolation.mount_private_proc()
    if "landlock" in measures:
        extra = [m[2:] for m in measures if m.startswith("w:")]
        own = [f"/proc/{os.getpid()}/task"] if "own_threads" in measures else []
        applied += isolation.restrict_writes([workdir, "/dev/shm", *extra], ["/dev", *own], block_tcp=True,
                                             scope="scope" in measures)
    if "landlock_read" in measures:
        from sandbox import read_roots
        applied += isolation.restrict_access(read_roots.default_read_roots([workdir]), [workdir, "/dev/shm"],
                                             read_roots.default_device_paths(), block_tcp=True, scope=True,
                                             proc_dir=f"/proc/{os.getpid()}/task")
    if "affinity" in measures:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        applied.append("affinity")
    if "privileges" in measures:
        from sandbox import privileges
        applied += privileges.drop_privileges(None)
    if "seccomp" in measures:
        from sandbox import seccomp
        if "unix_ok" in measures:
            seccomp._AF_INET = 1  # AF_UNIX allowed (AF_INET6 still is), to see whether the driver needs it
        if "mknod_ok" in measures:
            seccomp._DENIED = tuple(e for e in seccomp._DENIED if not e[0].startswith("mknod"))
        applied += seccomp.install_filter()
    if "second_ctx" in measures:
        holder_r, holder_w = os.pipe()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            try:
                import torch
                torch.ones(1, device="cuda")
                torch.cuda.synchronize()
                os.write(holder_w, b"1")
                time.sleep(20)
            finally:
                os.write(holder_w, b"0")
                os._exit(0)
        if os.read(holder_r, 1) == b"1":
            applied.append("second_ctx")
    t0 = time.monotonic()
    try:
        exec(compile(CUDA_PROBE_SRC, "<probe>", "exec"), {})
        ok, err = True, ""
    except BaseException as exc:  # noqa: BLE001 - the failure is the answer
        ok, err = False, f"{type(exc).__name__}: {exc}"[:600]
    print(json.dumps({"ok": ok, "error": err, "applied": applied, "probe_s": round(time.monotonic() - t0, 2)}),
          flush=True)


def run_row(name: str, measures: list[str], timeout: float) -> dict:
    from sandbox.launch import scrubbed_env
    with tempfile.TemporaryDirectory(prefix="cudaiso-") as wd:
        env = dict(os.environ)
        if "env" in measures:
            env = scrubbed_env({"HOME": wd, "TMPDIR": wd, "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                                "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
        t0 = time.monotonic()
        try:
            p = subprocess.run([sys.executable, "-m", "bench.cuda_isolation", "--child", ",".join(measures), wd],
                               env=env, capture_output=True, text=True, timeout=timeout)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            res = json.loads(lines[-1]) if lines else {"ok": False, "error": f"rc={p.returncode}: {p.stderr[-600:]}"}
        except subprocess.TimeoutExpired:
            res = {"ok": False, "error": f"timeout after {timeout} s"}
    return {"row": name, "measures": ",".join(m for m in measures if m != "env") or "-",
            "scrubbed_env": "env" in measures, "cuda_ok": res["ok"], "wall_s": round(time.monotonic() - t0, 1),
            "applied": ",".join(res.get("applied", [])), "error": res.get("error", "")}


def host_facts() -> dict:
    facts = {"devices": sorted(glob.glob("/dev/nvidia*")),
             "env": {k: v for k, v in os.environ.items() if any(s in k for s in ("CUDA", "NVIDIA", "LD_"))}}
    try:
        with open("/proc/driver/nvidia/params") as f:
            facts["driver_params"] = [ln.strip() for ln in f if "Modify" in ln or "DeviceFile" in ln]
    except OSError as exc:
        facts["driver_params"] = str(exc)
    from sandbox import isolation
    facts["landlock_abi"] = isolation.landlock_abi()
    facts["kernel"] = os.uname().release
    return facts


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child([m for m in sys.argv[2].split(",") if m], sys.argv[3])
        return
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--parallel", type=int, default=4)
    args = ap.parse_args()
    facts = host_facts()
    print(json.dumps(facts, indent=1), flush=True)

    def one(item: tuple[str, list[str]]) -> dict:
        row = run_row(item[0], item[1], args.timeout)
        progress("cuda_isolation", row)
        return row

    with concurrent.futures.ThreadPoolExecutor(args.parallel) as ex:
        rows = list(ex.map(one, ROWS.items()))
    report("cuda_isolation", args, rows, {"facts": facts},
           columns=["row", "measures", "cuda_ok", "wall_s", "applied", "error"])


if __name__ == "__main__":
    main()
