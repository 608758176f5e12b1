"""The Python half of ``scripts/gpu-check.sh``, which runs it: what a flagged process and its child check
on the GPU, torch_memory_saver's own tests run under the flag, and the tables both print.

``probe``: run in a process started with the flag. It checks the plan it was started with against
``doctor --deep``'s, pauses and resumes 8 GiB, then starts a ``spawn`` child that inherits the plan and
pauses and resumes 2 GiB of its own. ``suite``: torch_memory_saver's tests (the sdist's ``test/``), run in
a process started with ``TMS_AUTOPRELOAD=1``; those that fail are run again without it, as their CI runs
them, so that a failure says whose it is. ``select``: which of those files run, and why the others do not.
Without ``--gpu`` (``gpu-check.sh --dry-run``) every step runs up to the GPU and no further. This module is
also the pytest plugin (``-p gpu_check``) that writes each test's outcome as it ends, so that a run cut
off by its time limit still says what it did.
"""

from __future__ import annotations

import argparse
import ast
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GIB = 1 << 30
PARENT_GIB = 8
CHILD_GIB = 2
CHILD_SECONDS = 120  # the child's own start, torch's import and its 2 GiB: seconds on a GPU machine

# torch_memory_saver's test files, as its 0.0.10 sdist carries them. Each runs (True: it needs the GPU,
# and a dry run only collects it), in this order (seconds first, should the time run out), or is listed
# with why it does not (selection() decides).
RUN = {"test_configure_subprocess.py": False, "test_utils.py": False, "test_examples.py": True}
NOT_RUN = {"test_merge_cuda_wheels.py": "loads scripts/merge_cuda_wheels.py, which the sdist leaves out "
                                        "(and needs no GPU)"}
# What test_examples.py, their GPU tests, imports its scenarios from: their repository's test/examples/,
# which the sdist leaves out. The user gives it (TMS_EXAMPLES); gpu-check.sh puts it beside the sdist's test/.
EXAMPLES = "examples"
EXAMPLES_COMMIT = "4a43c97771f139db0215c1378e8a0b50e679d23d"  # whose sources the 0.0.10 sdist carries
NO_EXAMPLES = (f"its scenarios, test/{EXAMPLES}/, are not in the sdist; give TMS_EXAMPLES=DIR (torch_memory_saver's "
               f"test/{EXAMPLES} at {EXAMPLES_COMMIT[:7]}, see docs/gpu.md) to run it")


# ---------------------------------------------------------------- the table

class Table:
    """Rows printed as they are decided, so that a run cut short still shows what it checked."""

    def __init__(self) -> None:
        self.failed = False
        print(f"{'check':48s} {'result':6s} detail", flush=True)

    def row(self, name: str, passed: bool | None, detail: object) -> None:
        """``passed`` None: not checked here (a dry run stops before the GPU)."""
        self.failed |= passed is False
        result = "SKIP" if passed is None else "PASS" if passed else "FAIL"
        print(f"{name:48s} {result:6s} {detail}", flush=True)


# ---------------------------------------------------------------- what a process has mapped

def mapped(part: str) -> list[str]:
    """The files mapped into this process whose name holds ``part``, each once, by their real path."""
    with open("/proc/self/maps") as maps:
        fields = [line.split(None, 5) for line in maps]
    return sorted({os.path.realpath(f[5].strip()) for f in fields
                   if len(f) == 6 and part in os.path.basename(f[5].strip())})


def reexecd() -> bool:
    """True when this process image is the one the start-up hook's re-exec started: its initial
    environment (``/proc/self/environ``, unchanged by ``os.environ``) marks its own PID."""
    with open("/proc/self/environ", "rb") as f:
        return f"TMS_AUTOPRELOAD_EXEC_PID={os.getpid()}".encode() in f.read().split(b"\0")


def pause_resume(gib: int) -> list[tuple[str, bool, str]]:
    """Allocate ``gib`` GiB as slime's train worker does (every allocation pauseable from the start, with
    CPU backup: the flag's ``TMS_INIT_ENABLE=1``, so no ``region()``), pause, resume; the rows."""
    import torch
    from torch_memory_saver import torch_memory_saver

    torch.cuda.init()
    t0 = time.perf_counter()
    x = torch.arange(gib * GIB // 4, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    expect = x[:: 1 << 20].clone()
    free_before, _ = torch.cuda.mem_get_info()
    torch_memory_saver.pause()
    torch.cuda.synchronize()
    free_paused, _ = torch.cuda.mem_get_info()
    rose = free_paused - free_before
    torch_memory_saver.resume()
    torch.cuda.synchronize()
    same = torch.equal(x[:: 1 << 20], expect)
    return [(f"pause frees >= 90% of {gib} GiB", rose >= 0.9 * gib * GIB, f"free +{rose / GIB:.2f} GiB"),
            ("contents survive resume", same, f"{expect.numel()} sampled values compared"),
            ("time", True, f"{time.perf_counter() - t0:.1f} s for allocate/pause/resume")]


# ---------------------------------------------------------------- the probe and its child

def child(results: Any, parent_hooks: list[str], parent_cudart: list[str], gpu: bool) -> None:  # noqa: ANN401 - a multiprocessing queue
    """A ``spawn`` child of the flagged probe: it must start with the parent's plan, not a plan of its own."""
    rows: list[tuple[str, bool | None, str]] = []
    try:
        # Resolving imports the decision module; a child that inherits a plan never does.
        resolved = "tms_autopreload.decision" in sys.modules
        rows.append(("plan inherited (no re-exec, no resolve)", not reexecd() and not resolved,
                     f"re-executed: {reexecd()}, resolved again: {resolved}"))
        hooks = mapped("torch_memory_saver_hook")
        rows.append(("hook mapped (the parent's)", hooks == parent_hooks, ", ".join(hooks) or "none"))
        import torch  # noqa: F401 - its libraries map the runtime

        cudart = mapped("libcudart.so")
        rows.append(("one libcudart (the parent's)", cudart == parent_cudart, ", ".join(cudart) or "none"))
        if gpu:
            rows.extend(pause_resume(CHILD_GIB))
        else:
            rows.append((f"pause/resume {CHILD_GIB} GiB", None, "no GPU (dry run)"))
    except Exception as exc:  # noqa: BLE001 - the parent reports whatever stopped the child
        rows.append(("ran to the end", False, f"{type(exc).__name__}: {exc}"))
    results.put(rows)


def probe(deep_file: str, mode: str, version: str, gpu: bool) -> int:
    """The checks of one flagged process (``SLIME_OFFLOAD_TRAIN=1``) in ``mode``, with torch_memory_saver
    ``version``, and of its child."""
    from importlib.metadata import version as installed

    table = Table()
    table.row("torch_memory_saver installed", installed("torch_memory_saver") == version,
              installed("torch_memory_saver"))
    try:
        with open(deep_file) as f:
            deep = json.load(f)
    except (OSError, ValueError) as exc:
        deep = {"ok": False, "verdict": f"doctor --deep gave no report ({exc})"}
    table.row(f"doctor --deep --mode {mode} (binding proof)", bool(deep.get("ok")),
              deep.get("verdict") or deep.get("error"))
    planned = [os.path.realpath(deep["hook"])] if deep.get("hook") else None
    hooks = mapped("torch_memory_saver_hook")
    table.row("hook mapped (doctor's pick)", hooks == planned if planned else len(hooks) == 1,
              ", ".join(hooks) or "none")
    again = reexecd()
    table.row(f"applied in {mode} mode", again == (mode == "exec"),
              "re-executed once" if again else "loaded in this process, no re-exec")
    init = {k: os.environ.get(k) for k in ("TMS_INIT_ENABLE", "TMS_INIT_ENABLE_CPU_BACKUP")}
    table.row("TMS_INIT_ENABLE, _CPU_BACKUP (the flag's)", set(init.values()) == {"1"},
              " ".join(f"{k}={v}" for k, v in init.items()))
    import torch  # noqa: F401 - its libraries map the runtime

    cudart = mapped("libcudart.so")
    runtime = deep.get("runtime_library")
    table.row("one libcudart (doctor's)", cudart == [os.path.realpath(runtime)] if runtime else len(cudart) == 1,
              ", ".join(cudart) or "none")
    if gpu:
        try:
            for row in pause_resume(PARENT_GIB):
                table.row(*row)
        except Exception as exc:  # noqa: BLE001 - a failed allocation, pause or resume is this row's answer
            table.row(f"pause/resume {PARENT_GIB} GiB", False, f"{type(exc).__name__}: {exc}")
    else:
        table.row(f"pause/resume {PARENT_GIB} GiB", None, "no GPU (dry run)")
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=child, args=(results, hooks, cudart, gpu))
    proc.start()
    try:
        rows = results.get(timeout=CHILD_SECONDS)
    except Exception as exc:  # noqa: BLE001 - queue.Empty, or a child that died before it answered
        rows = [("child answered", False, f"no answer in {CHILD_SECONDS} s ({type(exc).__name__}); "
                                          f"exit code {proc.exitcode}")]
        proc.kill()
    proc.join()
    for name, passed, detail in rows:
        table.row(f"child: {name}", passed, detail)
    table.row("child: exit code", proc.exitcode == 0, proc.exitcode)
    return 1 if table.failed else 0


# ---------------------------------------------------------------- their tests: which files

def selection(tests: Path) -> tuple[dict[str, bool], dict[str, str]]:
    """Which of their test files at ``tests`` run (True: it needs the GPU) and which do not, with why:
    test_examples.py runs only where the user's scenarios, ``examples/``, are beside it."""
    if (tests / EXAMPLES).is_dir():
        return RUN, NOT_RUN
    return {n: gpu for n, gpu in RUN.items() if n != "test_examples.py"}, {"test_examples.py": NO_EXAMPLES, **NOT_RUN}


def select(tests: Path) -> int:
    """Every test file of the sdist's ``test/`` runs or is listed with why not, and where test_examples.py
    runs it finds every scenario it imports from ``examples/``; prints the selection."""
    run, not_run = selection(tests)
    found = sorted(p.name for p in tests.glob("test_*.py"))
    problems = [f"{name}: in the sdist, neither run nor listed" for name in found if name not in {*RUN, *NOT_RUN}]
    problems += [f"{name}: selected, not in the sdist" for name in RUN if name not in found]
    examples = tests / "test_examples.py"
    if "test_examples.py" in run and examples.exists():
        tree = ast.parse(examples.read_text())
        wanted = [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == EXAMPLES
                  for a in node.names]
        problems += [f"test_examples.py imports {EXAMPLES}.{name}: no {EXAMPLES}/{name}.py" for name in wanted
                     if not (tests / EXAMPLES / f"{name}.py").exists()]
        print(f"their tests: {EXAMPLES}/ has the {len(wanted)} scenarios test_examples.py imports")
    for name, gpu in run.items():
        print(f"their tests: run {name}" + (" (needs the GPU)" if gpu else ""))
    for name, why in not_run.items():
        print(f"their tests: not run {name}: {why}")
    for problem in problems:
        print(f"their tests: ERROR {problem}")
    return 1 if problems else 0


# ---------------------------------------------------------------- their tests: the runs

def pytest_collection_finish(session: Any) -> None:  # noqa: ANN401 - pytest's Session
    _record({"collected": [item.nodeid for item in session.items]})


def pytest_collectreport(report: Any) -> None:  # noqa: ANN401 - pytest's CollectReport
    if report.failed:
        _record({"id": report.nodeid or "collection", "when": "collect", "outcome": "failed",
                 "why": _last_line(report.longreprtext)})


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _record({"id": nodeid, "when": "start"})


def pytest_runtest_logreport(report: Any) -> None:  # noqa: ANN401 - pytest's TestReport
    why = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else \
        _last_line(report.longreprtext) if report.failed else ""
    # A failure's last words: what it printed (a spawned example's output too, captured at the descriptors),
    # then pytest's report; for a run on a machine that is gone once it ends.
    end = "\n".join(text for _, text in report.sections).splitlines()[-12:] if report.failed else []
    _record({"id": report.nodeid, "when": report.when, "outcome": report.outcome, "why": why, "end": end})


def _record(entry: dict[str, Any]) -> None:
    with open(os.environ["GPU_CHECK_OUTCOMES"], "a") as f:
        f.write(json.dumps(entry) + "\n")


def _last_line(text: str) -> str:
    """A report's last assertion line (``E ...``), else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("E ")] or lines
    return said[-1][:160] if said else ""


class Run:
    """One pytest run of their tests: what it collected, each test's outcome and why, as recorded."""

    def __init__(self, entries: list[dict[str, Any]], returncode: int | None) -> None:
        """``returncode``: pytest's, or None where it ran out of time (or had none left to start)."""
        self.collected: list[str] = []
        self.outcome: dict[str, str] = {}
        self.why: dict[str, str] = {}
        self.end: dict[str, list[str]] = {}
        self.errors: list[str] = []
        for e in entries:
            if "collected" in e:
                self.collected = e["collected"]
            elif e["when"] == "collect":
                self.errors.append(f"{e['id']}: {e['why']}")
            elif e["when"] == "start":
                self.outcome.setdefault(e["id"], "did not finish")
            elif self.outcome.get(e["id"]) != "failed" and (e["outcome"] != "passed" or e["when"] == "call"):
                # a failure in any phase stands; a skip (at setup or in the call) or the call's pass is the outcome
                self.outcome[e["id"]], self.why[e["id"]] = e["outcome"], e["why"]
                self.end[e["id"]] = e["end"]
        self.returncode = returncode

    def of(self, test: str) -> str:
        """The test's outcome; "not reached" where the run ended (or never started) before it."""
        return self.outcome.get(test, "not reached")


def run_pytest(python: str, tests: Path, args: list[str], env: dict[str, str], out: Path, tag: str,
               deadline: float) -> Run:
    """pytest on ``args`` (in ``tests``, which names them) in a process of ``python`` with ``env``, its output
    in ``out/<tag>.log``, ended at ``deadline`` (what it recorded until then is kept)."""
    record = out / f"{tag}.jsonl"
    record.unlink(missing_ok=True)
    (out / f"{tag}.log").unlink(missing_ok=True)
    env = {**env, "GPU_CHECK_OUTCOMES": str(record), "PYTHONPATH": str(Path(__file__).resolve().parent)}
    left = deadline - time.monotonic()
    code: int | None = None
    if left > 10:
        with open(out / f"{tag}.log", "w") as log:
            # A process group of its own, ended whole: their examples run in spawn children, which a
            # pytest ended by the time limit would leave running on the GPU.
            proc = subprocess.Popen([python, "-m", "pytest", "-p", "gpu_check", "-p", "no:cacheprovider", "-rs",
                                     f"--rootdir={tests}", *args], env=env, cwd=out, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # pytest is not reaped yet: the group is still its own
                proc.wait()
    entries = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return Run(entries, code)


def suite(python: str, tests: Path, out: Path, seconds: float, gpu: bool) -> int:
    """Their tests in a process started with ``TMS_AUTOPRELOAD=1`` (the hook only: their tests set
    ``TMS_INIT_*`` themselves); each that does not pass or skip there, again without the flag; one table."""
    deadline = time.monotonic() + seconds
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("TMS_", "SLIME_OFFLOAD"))}
    flagged = {**plain, "TMS_AUTOPRELOAD": "1"}
    selected, not_run = selection(tests)
    on_gpu = [str(tests / name) for name, needs_gpu in selected.items() if needs_gpu]
    files = [str(tests / name) for name, needs_gpu in selected.items() if gpu or not needs_gpu]
    run = run_pytest(python, tests, files, flagged, out, "flagged", deadline)
    later = Run([], 0)
    if not gpu and on_gpu:  # what the GPU would run, collected by a flagged start
        later = run_pytest(python, tests, ["--collect-only", "-q", *on_gpu], flagged, out, "collected", deadline)
    redo = [t for t in run.collected if run.of(t) not in ("passed", "skipped")]
    as_is = run_pytest(python, tests, [str(tests / t) for t in redo], plain, out, "as-is", deadline) if redo \
        else Run([], 0)
    print(f"{'test (their file::name)':64s} {'flagged':15s} {'as-is':15s} detail", flush=True)
    for t in run.collected:
        again = as_is.of(t) if t in redo else ""
        print(f"{t:64s} {run.of(t):15s} {again:15s} {run.why.get(t) or as_is.why.get(t, '')}")
        print("".join(f"    | {line}\n" for line in run.end.get(t, [])), end="")
    for t in later.collected:
        print(f"{t:64s} {'collected':15s} {'':15s} not run: no GPU (dry run)")
    for name, why in not_run.items():
        print(f"not run: {name}: {why}")
    for tag, r in (("flagged", run), ("collected", later), ("as-is", as_is)):
        for error in r.errors:
            print(f"{tag}: collection error: {error}")
        log = out / f"{tag}.log"
        if r.returncode is None and not log.exists():
            print(f"{tag}: not run, no time left to start it")
        elif r.returncode not in (0, 1):  # pytest's own trouble, or the time limit: what its output ended with
            ended = "ran out of time" if r.returncode is None else f"pytest exit {r.returncode}"
            print(f"{tag}: {ended}; {log} ends:")
            print("".join(f"    | {line}\n" for line in log.read_text(errors="replace").splitlines()[-15:]), end="")
    counts = {o: sum(1 for t in run.collected if run.of(t) == o)
              for o in ("passed", "skipped", "failed", "did not finish", "not reached")}
    print("flagged: " + ", ".join(f"{n} {o}" for o, n in counts.items() if n or o == "passed")
          + (f"; as-is, of those: {sum(1 for t in redo if as_is.of(t) == 'passed')} passed" if redo else "")
          + ("" if gpu or not on_gpu else f"; {len(later.collected)} GPU tests collected, not run")
          + ("" if on_gpu else "; their GPU tests (test_examples.py) did not run: no test/examples"))
    ok = bool(run.collected) and not redo and not run.errors and run.returncode == 0 \
        and (gpu or not on_gpu or (bool(later.collected) and not later.errors and later.returncode == 0))
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--deep", required=True)
    p.add_argument("--mode", choices=("exec", "dlopen"), required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--gpu", action="store_true")
    s = sub.add_parser("select")
    s.add_argument("tests", type=Path)
    r = sub.add_parser("suite")
    r.add_argument("--python", required=True)
    r.add_argument("--tests", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--seconds", type=float, required=True)
    r.add_argument("--gpu", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "probe":
        return probe(args.deep, args.mode, args.version, args.gpu)
    if args.command == "select":
        return select(args.tests)
    return suite(args.python, args.tests, args.out, args.seconds, args.gpu)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
