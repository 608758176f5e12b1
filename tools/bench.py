"""Start-up cost of tms_autopreload, measured as ratios side by side in one run (``make bench``).

Every row compares two ways of starting the same kind of process, interleaved run by run so
that machine noise hits both alike, and reports medians with their interquartile range. What
it builds (cached): a venv with the package, the same venv without it, the real
torch_memory_saver 0.0.9.post1 and CUDA 13 runtime wheels, a torch stand-in linked like the
CUDA 13 wheel, the driver stub where there is no driver, and (for P4) the real-torch venv.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from basics import CACHE, clean_env  # noqa: E402
from downloads import runtime_wheel  # noqa: E402
from sandbox import Venv, build_own_wheel, find_python, private_copy, revision_source, tms_wheel, torch_venv  # noqa: E402
from standins import driver_stub, global_deps, write_torch_standin  # noqa: E402

RESOLVE = ("import time; t = time.perf_counter(); from tms_autopreload import resolve; p = resolve(); "
           "print(time.perf_counter() - t)")
THEIRS = ("import time; t = time.perf_counter(); "
          "from torch_memory_saver.utils import get_binary_path_from_package as g; "
          "p = g('torch_memory_saver_hook_mode_preload'); print(time.perf_counter() - t)")
BREAKDOWN = """
import time, os
t0 = time.perf_counter()
from tms_autopreload import decision, trace
t1 = time.perf_counter()
calls = []
real = trace.start_traces
def timed(*a, **k):
    s = time.perf_counter(); collect = real(*a, **k)
    def wait():
        r = collect(); calls.append(time.perf_counter() - s); return r
    return wait
trace.start_traces = timed
report = decision.survey()
t2 = time.perf_counter()
print(t1 - t0, t2 - t1, sum(calls), len(calls))
"""


DLOPEN_BREAKDOWN = """
import os, time
from tms_autopreload import resolve
plan = resolve()
t0 = time.perf_counter()
from tms_autopreload import inprocess
t1 = time.perf_counter()
assert inprocess._obstacle(plan) is None  # what load() checks first, timed apart
t2 = time.perf_counter()
inprocess.load(plan, dict(os.environ))
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2 - (t2 - t1))
"""


def spawn(argv: list[str], env: dict[str, str]) -> tuple[float, int, int, float]:
    """(wall seconds, peak RSS in KiB, exit status, CPU seconds) of one process, output discarded."""
    t0 = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=[
        (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0), (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0)])
    _, status, usage = os.wait4(pid, 0)
    return (time.perf_counter() - t0, usage.ru_maxrss, os.waitstatus_to_exitcode(status),
            usage.ru_utime + usage.ru_stime)


def output(argv: list[str], env: dict[str, str]) -> str:
    r = subprocess.run(argv, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv)} failed:\n{r.stderr}")
    return r.stdout


def burst(argv: list[str], env: dict[str, str], n: int) -> tuple[float, int]:
    """Wall time for ``n`` concurrent starts, and how many exited 0."""
    t0 = time.perf_counter()
    pids = [os.posix_spawn(argv[0], argv, env, file_actions=[(os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0)])
            for _ in range(n)]
    ok = sum(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) == 0 for p in pids)
    return time.perf_counter() - t0, ok


T = TypeVar("T")


def interleave(a: Callable[[], T], b: Callable[[], T], n: int) -> tuple[list[T], list[T]]:
    """``n`` results of ``a`` and of ``b``, run in pairs whose order alternates (a b, b a, ...)."""
    xs: list[T] = []
    ys: list[T] = []
    for i in range(n):
        first, second = (a, b) if i % 2 == 0 else (b, a)
        r1, r2 = first(), second()
        xs.append(r1 if first is a else r2)
        ys.append(r2 if first is a else r1)
    return xs, ys


def paired_ratio(ours: list[float], base: list[float]) -> float:
    """Median of the per-pair ratios: each pair ran back to back, so slow drift cancels."""
    return statistics.median(a / b for a, b in zip(ours, base, strict=True))


def stats(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4) if len(values) >= 4 else [min(values), 0, max(values)]
    return statistics.median(values), q[2] - q[0]


def pth_floor(work: Path, without: Venv, base_env: dict[str, str], n: int) -> list[tuple[str, float, float]]:
    """What any .pth costs: a copy of the venv without the package, plus one .pth, vs the venv itself.

    (label, wall ratio, CPU ratio) for a .pth holding only ``import os`` and for this package's line.
    """
    import shutil

    copy = work / "venv-pth-floor"
    if not copy.exists():
        shutil.copytree(without.path, copy, symlinks=True)
    site = Venv(copy).site
    ours = next(line for line in (HERE.parent / "tms_autopreload.pth").read_text().splitlines()
                if line.startswith("import"))
    rows = []
    for label, line in (("a .pth holding only `import os`", "import os"), ("this package's .pth line", ours)):
        (site / "zz_floor.pth").write_text(line + "\n")
        a, b = interleave(lambda: spawn([str(copy / "bin" / "python"), "-c", "pass"], base_env),
                          lambda: spawn([str(without.python), "-c", "pass"], base_env), n)
        rows.append((label, paired_ratio([x[0] for x in a], [x[0] for x in b]),
                     paired_ratio([x[3] for x in a], [x[3] for x in b])))
    return rows


def pair(a: str, b: str, n: int) -> dict:
    """P1's measurement for two interpreters: ``a -c pass`` against ``b -c pass``, interleaved.

    Run by :func:`rootfs_p1` inside a root file system (``--pair``), so that nothing of the
    namespace and chroot around it is timed."""
    env = {"PATH": "/usr/bin:/bin"}
    xs, ys = interleave(lambda: spawn([a, "-c", "pass"], env), lambda: spawn([b, "-c", "pass"], env), n)
    ours, base = [x[0] for x in xs], [y[0] for y in ys]
    return {"ours": ours, "base": base, "ratio": paired_ratio(ours, base),
            "cpu_ratio": paired_ratio([x[3] for x in xs], [y[3] for y in ys])}


# The interpreters P1 is also measured on: Debian's, in their root file systems (tools/rootfs.py).
ROOTFS_PYTHONS = ("sid/3.14", "sid/3.15")


def rootfs_p1(work: Path, own: Path, spec: str, n: int) -> list[tuple[str, str, dict]]:
    """P1 in a Debian root file system: a venv with the wheel against a bare venv of the same
    interpreter; the floor any ``.pth`` puts there (a venv holding one ``import os`` line); and on an
    interpreter that reads PEP 829 ``.start`` files, the wheel with one beside its ``.pth`` (what
    shipping a ``.start`` would cost). Rows are (what, target, measurement)."""
    import shutil

    from rootfs import Rootfs, RootfsVenv

    suite, _, version = spec.partition("/")
    home = work / f"rootfs-{suite}-{version}"
    home.mkdir(parents=True, exist_ok=True)
    fs = Rootfs(suite, [home, own.parent, HERE])
    venvs = {}
    for name in ("with", "bare", "floor"):
        path = home / f"venv-{name}"
        if not (path / ".ready").exists():
            shutil.rmtree(path, ignore_errors=True)
            RootfsVenv(fs, path, fs.python(version))
            (path / ".ready").touch()
        venvs[name] = RootfsVenv(fs, path)
    venvs["with"].install(own)
    (venvs["floor"].site / "zz_floor.pth").write_text("import os\n")
    start = venvs["with"].site / "tms_autopreload.start"

    def measure(ours: RootfsVenv) -> dict:
        out = fs.run([fs.python(version), str(HERE / "bench.py"), "--pair", str(ours.python),
                      str(venvs["bare"].python), "--n", str(n)]).stdout
        measured: dict[str, Any] = json.loads(out)
        return measured

    rows = [("installed, no flag", "<= 1.03", measure(venvs["with"])),
            ("floor: a venv holding one `.pth` of only `import os`", "report only", measure(venvs["floor"]))]
    if fs.run([fs.python(version), "-c", "import sys; print(sys.version_info >= (3, 15))"]).stdout.strip() == "True":
        start.write_text("tms_autopreload:process_startup\n")
        try:
            rows.append(("installed, no flag, with a `.start` beside the `.pth`", "report only",
                         measure(venvs["with"])))
        finally:
            start.unlink()
    return rows


def standin_venv(path: Path, python: str, wheels: list[Path], work: Path) -> Venv:
    """A venv (cached at ``path``) with ``wheels`` and a torch stand-in linked like the CUDA 13 wheel."""
    if not (path / ".ready").exists():
        v = Venv(path, python, wheels)
        deps = global_deps(work / "deps" / "libtorch_global_deps.so", v.site / "nvidia" / "cu13" / "lib",
                           "libcudart.so.13", "$ORIGIN/../../nvidia/cu13/lib")
        write_torch_standin(v.site, cuda="13.0", hip=None, deps_lib=deps)
        (path / ".ready").touch()
    return Venv(path)


def common_wheels() -> list[Path]:
    """What every bench venv holds besides this package: torch_memory_saver and NVIDIA's CUDA 13 runtime."""
    return [tms_wheel("0.0.9.post1"), runtime_wheel(13)]


def setup(work: Path, python: str) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    own = build_own_wheel(work / "dist")
    common = common_wheels()
    venvs = {name: standin_venv(work / f"venv-{name}", python, wheels, work)
             for name, wheels in (("with", [own, *common]), ("without", common))}
    venvs["with"].install(own)
    base = clean_env()
    probe = output([str(venvs["with"].python), "-c",
                    "from tms_autopreload.ldso import Loader; import sys; "
                    "print(Loader.for_executable(sys.executable, '').find('libcuda.so.1') is not None)"], base)
    stub = None
    if probe.strip() != "True":
        stub = driver_stub(work / "driver").parent
        base["LD_LIBRARY_PATH"] = str(stub)
    # The plan of ``base`` itself, the stub's directory on LD_LIBRARY_PATH included (``env --json`` is the plan
    # of a Ray worker's environment, which drops this shell's LD_LIBRARY_PATH, and with it the stub).
    plan = json.loads(output([str(venvs["with"].python), "-c", "import json; from tms_autopreload import resolve; "
                              "print(json.dumps(resolve().changes()))"], base))
    return {"venvs": venvs, "base": base, "preset": {**base, **plan}, "stub": stub, "own": own,
            "inherited": inherited(venvs["with"], base), "inherited_dlopen": inherited(venvs["with"], base, "dlopen")}


def inherited(venv: Venv, base: dict[str, str], mode: str = "exec") -> dict[str, str]:
    """The environment a flagged start of ``venv``'s interpreter leaves its children (the flag, the plan,
    the hook's own variables)."""
    dump = [str(venv.python), "-c", "import os, json; print(json.dumps(dict(os.environ)))"]
    mode_var = {"TMS_AUTOPRELOAD_MODE": mode} if mode != "exec" else {}
    environ: dict[str, str] = json.loads(output(dump, {**base, "SLIME_OFFLOAD_TRAIN": "1", **mode_var}))
    return environ


def revision_venv(rev: str, work: Path, python: str) -> tuple[str, Venv]:
    """(rev's short id, a venv like setup()'s "with" one holding the package as git revision ``rev`` has it)."""
    sha, src = revision_source(rev, work)
    wheels = [build_own_wheel(work / f"dist-{sha}", src), *common_wheels()]
    return sha, standin_venv(work / f"venv-{sha}", python, wheels, work)


def against(rev: str, work: Path, python: str, s: dict, n: int) -> tuple[str, list[tuple[str, float, float]]]:
    """P1, P2, P2' and P3 of this checkout and of the package at git revision ``rev``, each against its
    baseline, all three starts of a row interleaved run by run: (rev's short id, [(row, ours, rev's)]).

    Both venvs hold the same torch_memory_saver, runtime and stand-in, so the rows differ only in the
    package's code: the figure for a change's cost, on whatever machine runs it."""
    sha, theirs = revision_venv(rev, work, python)
    ours_py, theirs_py = str(s["venvs"]["with"].python), str(theirs.python)
    without_py = str(s["venvs"]["without"].python)
    flagged = {**s["base"], "SLIME_OFFLOAD_TRAIN": "1"}
    dlopen = {**flagged, "TMS_AUTOPRELOAD_MODE": "dlopen"}
    rows = (("P1", (ours_py, s["base"]), (theirs_py, s["base"]), (without_py, s["base"]), n),
            ("P2", (ours_py, flagged), (theirs_py, flagged), (ours_py, s["preset"]), max(n // 2, 10)),
            ("P2'", (ours_py, dlopen), (theirs_py, dlopen), (ours_py, s["preset"]), max(n // 2, 10)),
            ("P3", (ours_py, s["inherited"]), (theirs_py, inherited(theirs, s["base"])), (ours_py, s["preset"]), n))
    out = []
    for name, *starts, runs in rows:
        times: list[list[float]] = [[], [], []]
        for i in range(runs):
            order = (0, 1, 2) if i % 2 == 0 else (2, 1, 0)
            for k in order:
                py, env = starts[k]
                wall, _, status, _ = spawn([py, "-c", "pass"], env)
                if status != 0:
                    raise SystemExit(f"bench: {name} start of {py} exited {status}")
                times[k].append(wall)
        out.append((name, paired_ratio(times[0], times[2]), paired_ratio(times[1], times[2])))
    return sha, out


# The standard-library modules docs/performance.md weighs against the start-up budget.
IMPORT_COSTS = ("dataclasses", "typing", "subprocess", "threading", "pathlib", "re", "importlib.util", "ctypes",
                "struct")


def import_costs(python: str, n: int) -> list[tuple[str, float]]:
    """(module, median cumulative import time in ms) of each of :data:`IMPORT_COSTS` in a fresh
    interpreter (``-X importtime``, its own line: everything it pulls in that was not loaded yet)."""
    out = []
    for module in IMPORT_COSTS:
        times = []
        for _ in range(n):
            err = subprocess.run([python, "-S", "-X", "importtime", "-c", f"import {module}"], env=clean_env(),
                                 capture_output=True, text=True, check=True).stderr
            line = next(line for line in err.splitlines() if line.rstrip().endswith(f"| {module}"))
            times.append(int(line.split("|")[1]) / 1000)
        out.append((module, statistics.median(times)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="tms_autopreload start-up benchmark")
    parser.add_argument("--dir", type=Path, default=CACHE / "bench")
    parser.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    parser.add_argument("--n", type=int, default=200, help="runs per side for P1 and P3 (P2: n/2)")
    parser.add_argument("--skip-torch", action="store_true", help="skip P4 (needs the 5.5 GB real-torch venv)")
    parser.add_argument("--only-rootfs", action="store_true", help="only P1 in the Debian root file systems")
    parser.add_argument("--imports", action="store_true",
                        help="only what each standard-library module the docs weigh costs to import (median of --n)")
    parser.add_argument("--against", metavar="REV",
                        help="only P1, P2, P2' and P3, of this checkout and of git revision REV side by side")
    parser.add_argument("--pair", nargs=2, metavar=("OURS", "BASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.imports:
        interpreter = find_python(args.python) or sys.executable
        print(f"import costs, {interpreter} (`-X importtime` cumulative, median of {args.n}; {_cpu()}):")
        for module, ms in import_costs(interpreter, args.n):
            print(f"  {module:15} {ms:6.2f} ms")
        return 0
    if args.pair:
        ours, base = args.pair
        print(json.dumps(pair(ours, base, args.n)))
        return 0
    if args.only_rootfs:
        return print_rootfs_rows(args.dir, build_own_wheel(args.dir / "dist"), args.n)
    python = find_python(args.python)
    if python is None:
        raise SystemExit(f"bench: python{args.python} not found")
    s = setup(args.dir, python)
    if args.against:
        sha, out = against(args.against, args.dir, python, s, args.n)
        print(f"machine: {platform.node()}, {os.cpu_count()} cores, {_cpu()}; Python {platform.python_version()}; "
              f"load average {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M %Z')}")
        print(f"| id | this checkout | {args.against} ({sha}) |\n| --- | --- | --- |")
        for name, ours, theirs in out:
            print(f"| {name} | {ours:.3f} | {theirs:.3f} |")
        return 0
    with_py, without_py = str(s["venvs"]["with"].python), str(s["venvs"]["without"].python)
    flagged = {**s["base"], "SLIME_OFFLOAD_TRAIN": "1"}
    rows = []

    cpu_ratios = {}

    def row(pid: str, what: str, versus: str, target: str, ours: list[float], theirs: list[float],
            ratio_ok: Callable[[float], bool], unit: str = "ms", scale: float = 1000.0,
            ratio: float | None = None) -> None:
        (mo, io), (mt, it) = stats(ours), stats(theirs)
        r = ratio if ratio is not None else paired_ratio(ours, theirs)
        rows.append((pid, what, versus, target, f"{mo * scale:.2f} ± {io * scale:.2f} {unit}",
                     f"{mt * scale:.2f} ± {it * scale:.2f} {unit}", f"{r:.3f}" if r < 100 else f"{r:.0f}",
                     "yes" if ratio_ok(r) else "NO"))

    # P1: no flag, package installed vs not installed.
    a, b = interleave(lambda: spawn([with_py, "-c", "pass"], s["base"]),
                      lambda: spawn([without_py, "-c", "pass"], s["base"]), args.n)
    row("P1", "`python -c pass`, installed, no flag", "same venv without the package", "<= 1.01",
        [x[0] for x in a], [x[0] for x in b], lambda r: r <= 1.01)
    cpu_ratios["P1"] = paired_ratio([x[3] for x in a], [x[3] for x in b])
    # P2: first flagged start (resolve + verify + exec) vs LD_PRELOAD preset.
    a, b = interleave(lambda: spawn([with_py, "-c", "pass"], flagged),
                      lambda: spawn([with_py, "-c", "pass"], s["preset"]), max(args.n // 2, 10))
    assert all(x[2] == 0 for x in a), "flagged start failed"
    row("P2", "first start with SLIME_OFFLOAD_TRAIN=1", "LD_PRELOAD preset to the plan", "<= 2.2",
        [x[0] for x in a], [x[0] for x in b], lambda r: r <= 2.2)
    cpu_ratios["P2"] = paired_ratio([x[3] for x in a], [x[3] for x in b])
    p6 = [x[1] for x in a]
    # P2': the same first start in dlopen mode (no second start).
    a, b = interleave(lambda: spawn([with_py, "-c", "pass"], {**flagged, "TMS_AUTOPRELOAD_MODE": "dlopen"}),
                      lambda: spawn([with_py, "-c", "pass"], s["preset"]), max(args.n // 2, 10))
    assert all(x[2] == 0 for x in a), "flagged dlopen-mode start failed"
    row("P2'", "first start, SLIME_OFFLOAD_TRAIN=1, TMS_AUTOPRELOAD_MODE=dlopen", "LD_PRELOAD preset to the plan",
        "<= 1.3", [x[0] for x in a], [x[0] for x in b], lambda r: r <= 1.3)
    cpu_ratios["P2'"] = paired_ratio([x[3] for x in a], [x[3] for x in b])
    # P3: a child that inherits the hook and the flag vs LD_PRELOAD preset and no flag.
    a, b = interleave(lambda: spawn([with_py, "-c", "pass"], s["inherited"]),
                      lambda: spawn([with_py, "-c", "pass"], s["preset"]), args.n)
    row("P3", "child start: flag set, hook inherited", "LD_PRELOAD preset, no flag", "<= 1.03",
        [x[0] for x in a], [x[0] for x in b], lambda r: r <= 1.03)
    cpu_ratios["P3"] = paired_ratio([x[3] for x in a], [x[3] for x in b])
    # P3': a child of a dlopen-mode process (it inherits the real LD_PRELOAD).
    a, b = interleave(lambda: spawn([with_py, "-c", "pass"], s["inherited_dlopen"]),
                      lambda: spawn([with_py, "-c", "pass"], s["preset"]), args.n)
    row("P3'", "child start of a dlopen-mode parent", "LD_PRELOAD preset, no flag", "<= 1.03",
        [x[0] for x in a], [x[0] for x in b], lambda r: r <= 1.03)
    cpu_ratios["P3'"] = paired_ratio([x[3] for x in a], [x[3] for x in b])
    # P4: deciding the file, timed inside a fresh process.
    if not args.skip_torch:
        # A private copy: the cached venv serves the test suite, which must find nothing installed in it.
        tv = private_copy(torch_venv(python), args.dir / "venv-torch")
        tv.install(s["own"], tms_wheel("0.0.9.post1"))
        ours_t, theirs_t = [], []
        for _ in range(7):
            ours_t += [float(output([str(tv.python), "-c", RESOLVE], s["base"])) for _ in range(5)]
            theirs_t.append(float(output([str(tv.python), "-c", THEIRS], s["base"])))
        mo, mt = statistics.median(ours_t), statistics.median(theirs_t)
        row("P4", "deciding the file: `resolve()` (real torch venv)",
            "torch_memory_saver `get_binary_path_from_package` (imports torch)", ">= 100x faster",
            ours_t, theirs_t, lambda r: r >= 100, ratio=mt / mo)
        # P7: the binding proof, whole command, vs the `import torch` it wraps.
        deep = [str(tv.python), "-m", "tms_autopreload", "doctor", "--deep"]
        a, b = interleave(lambda: spawn(deep, s["base"]),
                          lambda: spawn([str(tv.python), "-c", "import torch"], s["base"]), 5)
        assert all(x[2] == 0 for x in a), "doctor --deep did not prove the binding"
        log_mb = json.loads(output([*deep, "--json"], s["base"]))["log_bytes"] / 1e6
        row("P7", f"`doctor --deep` (real torch; {log_mb:.0f} MB of binding log)", "`python -c 'import torch'`",
            "report only", [x[0] for x in a], [x[0] for x in b], lambda r: True)
    # P5: 64 concurrent starts.
    hooked, preset = interleave(lambda: burst([with_py, "-c", "pass"], flagged, 64),
                                lambda: burst([with_py, "-c", "pass"], s["preset"], 64), 5)
    assert all(ok == 64 for _, ok in hooked), "a flagged start in the burst failed"
    row("P5", "64 concurrent flagged starts (all hooked)", "64 concurrent preset starts", "wall <= 2.5",
        [x[0] for x in hooked], [x[0] for x in preset], lambda r: r <= 2.5)
    # P6: peak RSS of the resolving + exec'ing process vs plain `python -c pass`.
    plain = [spawn([with_py, "-c", "pass"], s["base"])[1] for _ in range(len(p6))]
    delta_mb = (statistics.median(p6) - statistics.median(plain)) / 1024
    rows.append(("P6", "peak RSS, flagged start (resolve + exec + hook mapped)", "plain `python -c pass`",
                 "<= +5 MB", f"{statistics.median(p6) / 1024:.1f} MiB", f"{statistics.median(plain) / 1024:.1f} MiB",
                 f"{delta_mb:+.1f} MiB", "yes" if delta_mb <= 5 else "NO"))

    floor = pth_floor(args.dir, s["venvs"]["without"], s["base"], args.n)
    br = [list(map(float, output([with_py, "-c", BREAKDOWN], s["base"]).split())) for _ in range(20)]
    dl = [list(map(float, output([with_py, "-c", DLOPEN_BREAKDOWN], s["base"]).split())) for _ in range(20)]
    dl_imp, dl_obs, dl_load = (statistics.median(c[i] for c in dl) * 1000 for i in range(3))
    imp, surv, tr = (statistics.median(c[i] for c in br) * 1000 for i in range(3))

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"{_cpu()}; Python {platform.python_version()} ({python}); {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"driver: {'stub on LD_LIBRARY_PATH' if s['stub'] else 'real'}; runs per side: P1/P3 {args.n}, "
          f"P2/P2'/P6 {max(args.n // 2, 10)}, P3' {args.n}, P4 35 vs 7, P5 5 bursts, P7 5")
    print()
    print("| id | what | compared with | target | ours (median ± IQR) | baseline | ratio | met |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()
    print("CPU-time ratios (user+sys of the started process, median of pairs): "
          + ", ".join(f"{k} {v:.3f}" for k, v in cpu_ratios.items()))
    print("ratio = median of per-pair ratios (each pair ran back to back, order alternating); "
          "times are wall-clock medians ± interquartile range")
    for label, wall, cpu in floor:
        print(f"P1 floor: {label}: wall ratio {wall:.3f}, CPU ratio {cpu:.3f} ({args.n} pairs)")
    print(f"flagged path, in-process (median of 20): imports {imp:.2f} ms, survey {surv:.2f} ms "
          f"of which the loader trace {tr:.2f} ms (start to answer, with the reads done meanwhile)")
    print(f"dlopen mode, after the survey (median of 20): imports {dl_imp:.2f} ms (with _ctypes), "
          f"obstacle checks {dl_obs:.2f} ms (maps, interposed symbols, dlsym), the two dlopens {dl_load:.2f} ms")
    print()
    return print_rootfs_rows(args.dir, s["own"], args.n)


def print_rootfs_rows(work: Path, own: Path, n: int) -> int:
    """P1 on Debian's CPython 3.14 and 3.15 (no driver or torch needed: nothing is flagged)."""
    from rootfs import Rootfs

    print("| id | what | compared with | target | ours (median ± IQR) | baseline | ratio | CPU ratio | met |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for spec in ROOTFS_PYTHONS:
        suite, _, version = spec.partition("/")
        glibc = Rootfs(suite, [work]).glibc()
        for what, target, m in rootfs_p1(work, own, spec, n):
            (mo, io), (mb, ib) = stats(m["ours"]), stats(m["base"])
            met = "-" if target == "report only" else "yes" if m["ratio"] <= 1.03 else "NO"
            print(f"| P1 {spec} | `python{version} -c pass` (Debian {suite}, glibc {glibc}): {what} "
                  f"| bare venv of the same interpreter | {target} | {mo * 1000:.2f} ± {io * 1000:.2f} ms "
                  f"| {mb * 1000:.2f} ± {ib * 1000:.2f} ms | {m['ratio']:.3f} | {m['cpu_ratio']:.3f} | {met} |")
    return 0


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "cpu unknown"


if __name__ == "__main__":
    raise SystemExit(main())
