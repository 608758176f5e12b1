"""Where the real loader binds each library's references to the hook's symbols: evidence about a plan.

A mapped hook and ``dlsym(RTLD_DEFAULT, "cudaMalloc")`` landing in it are indirect. What matters is
which object the loader binds torch's *own* references to: ``libc10_cuda.so`` holds torch's CUDA
caching allocator. glibc shows that without a GPU: with ``LD_BIND_NOW=1`` every reference is bound
when its library loads, and ``LD_DEBUG=bindings`` writes one line per binding (ld.so(8)), e.g.::

    12345:	binding file /x/torch/lib/libc10_cuda.so [0] to /x/hook.so [0]: normal symbol `cudaMalloc' [libcudart.so.13]

:func:`check` runs one child under a given environment with those two variables, imports a module,
and classifies every reference to an *interposed* symbol (one the hook defines and the runtime
library also defines, read from both dynamic symbol tables). It decides nothing about which build to
use: :func:`tms_autopreload.decision.survey` does. This proves binding, not that the hook's driver calls
work on a GPU.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ...builds import interposed
from ...elf import ElfError, read_dynamic
from ...errors import CAUSE_IDLE_RUNTIME, CAUSE_SECOND_RUNTIME_BOUND
from ...symbols import read_symbols
from ...environment import (EXEC_VAR, FLAG_VARS, GENERIC_FLAG, MODE_VAR, STATE_VAR, VERBOSE_VAR, is_tms_entry,
                           parse_flag, same_file, split_preload)
from ...gpu_libraries import CUDA, HIP, runtime_of, soname_prefix

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from ...verdict import Plan

__all__ = ["Binding", "Library", "Evidence", "parse_binding", "check", "judge", "under_test", "DEEP_VARS",
           "ALLOCATOR"]

# What the child runs with, on top of the environment under test.
DEEP_VARS = {"LD_BIND_NOW": "1", "LD_DEBUG": "bindings"}
# torch's CUDA caching allocator: the library whose bindings matter most.
ALLOCATOR = "libc10_cuda.so"
# glibc elf/dl-lookup.c, _dl_debug_bindings: "%5d:\tbinding file %s [%lu] to %s [%lu]: %s symbol `%s'"
# followed by " [VERSION]" when the reference is versioned. Paths may hold spaces; greedy groups
# take the last " [N] to " and " [N]: ", which the loader writes after the paths.
_BINDING = re.compile(r"\s*(\d+):\s+binding file (.+) \[(\d+)\] to (.+) \[(\d+)\]: (normal|protected) symbol "
                      r"`([^'`]+)'(?: \[([^\]]*)\])?\s*")
# The child's report, one marked line: what is mapped after the import, whether its start-up hook
# re-exec'd it (tms_autopreload.environment.reexecuted, whatever was logged), and the import's failure as data (a
# module that cannot be imported is told apart from a hook that is not mapped).
_MARK = "TMS-DEEP-REPORT "
_PROBE = """
import importlib, json, os, sys
try:
    importlib.import_module(sys.argv[1])
    failed = None
except Exception as exc:
    failed = f'{type(exc).__name__}: {exc}'
from tms_autopreload.environment import mapped_objects, reexecuted
seen = {}
for path in mapped_objects():
    try:
        st = os.stat(path)
    except OSError:
        continue
    seen.setdefault((st.st_dev, st.st_ino), path)
print(%r + json.dumps({'maps': sorted(seen.values()), 'execd': reexecuted(), 'import_error': failed}))
""" % _MARK


class Binding:
    """One line of the loader's binding log."""

    __slots__ = ("pid", "referrer", "target", "symbol", "version")

    def __init__(self, pid: int, referrer: str, target: str, symbol: str, version: "str | None") -> None:
        self.pid = pid
        self.referrer = referrer  # the object whose reference was bound
        self.target = target  # the object that provided the definition
        self.symbol = symbol
        self.version = version


def parse_binding(line: str) -> "Binding | None":
    """A binding line of ``LD_DEBUG=bindings`` output, or None for any other line."""
    m = _BINDING.fullmatch(line)
    if m is None:
        return None
    return Binding(int(m.group(1)), m.group(2), m.group(4), m.group(7), m.group(8))


class Library:
    """One library's references to interposed symbols and where each was bound (None: unbound)."""

    __slots__ = ("path", "bound", "status", "reason")

    def __init__(self, path: str) -> None:
        self.path = path
        self.bound: "dict[str, str | None]" = {}
        self.status = ""  # "intercepted", "bypassed" or "unbound"
        self.reason = ""

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def label(self) -> str:
        return f"torch's CUDA allocator ({self.name})" if self.name == ALLOCATOR else self.name


class Evidence:
    """What the deep check saw; ``ok`` only when every reference binds to the hook and one runtime is mapped."""

    __slots__ = ("module", "hook", "runtime_library", "interposed", "libraries", "runtimes", "hook_mapped",
                 "hook_runtime", "import_error", "log_bytes", "seconds", "error", "bound_by", "idle", "bound_fix")

    def __init__(self, module: str, hook: "str | None", runtime_library: "str | None",
                 symbols: "tuple[str, ...]" = ()) -> None:
        self.module = module
        self.hook = hook  # None: no plan, nothing was checked
        self.runtime_library = runtime_library
        self.interposed = symbols
        self.libraries: "list[Library]" = []
        self.runtimes: "list[str]" = []  # runtime libraries mapped in the child after the import
        self.hook_mapped: "bool | None" = None  # None: the child never reported
        self.import_error: "str | None" = None  # the child ran, but `import module` raised this
        self.hook_runtime: "list[str]" = []  # runtime libraries the hook's own references were bound to
        self.log_bytes = 0
        self.seconds = 0.0
        self.error: "str | None" = None
        # Per runtime library mapped: the other objects the log shows bound to it (its own references aside).
        self.bound_by: "dict[str, list[str]]" = {}
        # The runtime copies mapped besides one that takes bindings, which nothing binds to (torch's by-path,
        # RTLD_LOCAL load of another wheel's copy): :func:`.document.second_runtime` of each.
        self.idle: "list[dict]" = []
        self.bound_fix: "str | None" = None  # the fix where two runtime copies take bindings, from the caller

    @property
    def split(self) -> bool:
        """More than one runtime copy takes bindings (or none is mapped): not one runtime for hook and module."""
        return len(self.runtimes) - len(self.idle) != 1

    @property
    def ok(self) -> bool:
        return (self.error is None and self.import_error is None and bool(self.libraries)
                and not self.split and all(lib.status == "intercepted" for lib in self.libraries))

    @property
    def cause(self) -> "str | None":
        """Why more than one runtime is mapped (:data:`tms_autopreload.errors.CAUSES`), or None."""
        if self.error or self.import_error or not self.runtimes:
            return None
        if self.split:
            return CAUSE_SECOND_RUNTIME_BOUND
        return CAUSE_IDLE_RUNTIME if self.idle else None

    @property
    def fix(self) -> "str | None":
        if self.cause == CAUSE_SECOND_RUNTIME_BOUND:
            return self.bound_fix or "run `tms-autopreload doctor`: it names what each copy is and why it is chosen"
        fixes = [second["fix"] for second in self.idle if second["fix"]]
        return "; ".join(fixes) if fixes else None

    def verdict(self) -> str:
        if self.error:
            return f"NOT PROVEN: {self.error}"
        if self.import_error:
            return f"NOT PROVEN: `import {self.module}` failed in the child: {self.import_error}"
        if self.split:
            forwards = (f"the hook's own calls were bound to {', '.join(self.hook_runtime)}, "
                        if self.hook_runtime else "")
            counts = {r: len(self.bound_by.get(r, [])) for r in self.runtimes}
            bound = [f"{r} (bound by {n} object{'' if n == 1 else 's'})" for r, n in counts.items()]
            head = (f"NOT PROVEN: {len(self.runtimes)} runtime libraries are mapped after `import {self.module}` "
                    f"({', '.join(bound) or 'none'}): {forwards}")
            taking = [r for r, n in counts.items() if n]
            if len(taking) == 1:
                return (head + f"so the calls land in {taking[0]}, not in {self.runtime_library}, the copy the "
                        f"plan binds for torch; expected that one alone to take bindings")
            return (head + "so allocations the hook forwards and the rest of the module's CUDA calls can land in "
                    "different runtimes; expected exactly one that takes bindings")
        if not self.libraries:
            return (f"NOT PROVEN: no library loaded by `import {self.module}` references "
                    f"{', '.join(self.interposed)}")
        bad = [lib for lib in self.libraries if lib.status != "intercepted"]
        if bad:
            return f"BYPASSED: {len(bad)} of {len(self.libraries)} libraries do not reach the hook"
        count = sum(len(lib.bound) for lib in self.libraries)
        if self.idle:
            return (f"INTERCEPTED: every reference ({len(self.libraries)} libraries, {count} bindings) binds to the "
                    f"hook; one runtime library takes bindings, and {len(self.idle)} more mapped that nothing binds "
                    f"to ({', '.join(second['path'] for second in self.idle)})")
        return (f"INTERCEPTED: every reference ({len(self.libraries)} libraries, {count} bindings) binds to the "
                f"hook; one runtime library mapped")

    def to_dict(self) -> dict:
        return {
            "ok": self.ok, "module": self.module, "hook": self.hook, "hook_mapped": self.hook_mapped,
            "runtime_library": self.runtime_library, "interposed": list(self.interposed),
            "runtime_libraries_mapped": self.runtimes, "runtime_bound_by": self.bound_by,
            "idle_runtimes": self.idle, "hook_bound_to": self.hook_runtime,
            "libraries": [{"path": lib.path, "name": lib.name, "status": lib.status, "reason": lib.reason,
                           "bindings": lib.bound} for lib in self.libraries],
            "import_error": self.import_error, "log_bytes": self.log_bytes, "seconds": round(self.seconds, 3),
            "verdict": self.verdict(), "cause": self.cause, "fix": self.fix,
            "error": self.error,
        }

    def text(self, under: str) -> str:
        """The report ``doctor --deep`` prints: what ran ``under`` what (:func:`under_test`), the hook,
        the symbols and runtimes, one line per library, the verdict."""
        mapped = {True: "mapped", False: "NOT mapped", None: "not checked"}[self.hook_mapped]
        lines = [f"deep:     `import {self.module}` under {under} with LD_BIND_NOW=1 LD_DEBUG=bindings: "
                 f"{self.seconds:.1f} s, {self.log_bytes / 1e6:.1f} MB of binding log (read line by line, deleted)"]
        if self.import_error:
            lines.append(f"import:   FAILED: {self.import_error}")
        lines += [f"hook:     {self.hook} ({mapped})",
                  f"symbols:  {', '.join(self.interposed) or 'none'} (defined by the hook and by "
                  f"{self.runtime_library})",
                  f"runtime:  {len(self.runtimes)} mapped: {', '.join(self.runtimes) or 'none'}", ""]
        for lib in self.libraries:
            to = ("hook" if lib.status == "intercepted" else
                  ", ".join(sorted(os.path.basename(t or "nothing") for t in set(lib.bound.values()))))
            line = f"{lib.label()}: {', '.join(lib.bound)} -> {to}"
            lines.append(line if lib.status == "intercepted" else f"{line} ({lib.status.upper()}: {lib.reason})")
        from .document import warning_of_second

        lines += [f"warning: {warning_of_second(second)}" for second in self.idle]
        lines.append(f"\nverdict:  {self.verdict()}")
        if self.cause:
            lines.append(f"cause:    {self.cause}" + (f"; fix: {self.fix}" if self.fix else ""))
        return "\n".join(lines)


# Written in a binding line to a runtime library (its path, and the version of a reference to it).
_RUNTIME_MARKS = tuple(soname_prefix(kind).rstrip(".").encode() for kind in (CUDA, HIP))


def _read_log(directory: str, hook: str, symbols: "frozenset[str]", ev: Evidence,
              users: "dict[str, set[str]]") -> "dict[str, Library]":
    """Stream every ``LD_DEBUG_OUTPUT`` file (one per PID), line by line (``hook``: ``ev.hook``, known here).

    Keeps the bindings of interposed symbols, the runtime libraries the hook's own references were bound
    to (where its calls forward), and in ``users`` which objects are bound to each runtime library (its own
    references to itself aside): a copy nothing binds to takes no call.
    """
    libraries: "dict[str, Library]" = {}
    is_hook: "dict[str, bool]" = {}
    needles = [f"`{sym}'".encode() for sym in symbols]
    hook_name = os.path.basename(hook).encode("utf-8", "surrogateescape")
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        ev.log_bytes += os.path.getsize(path)
        with open(path, "rb") as f:
            for raw in f:
                if b"binding file" not in raw:
                    continue
                runtime_line = any(m in raw for m in _RUNTIME_MARKS)
                if not (runtime_line or hook_name in raw or any(n in raw for n in needles)):
                    continue
                b = parse_binding(raw.decode("utf-8", "surrogateescape"))
                if b is None:
                    continue
                if runtime_line and b.referrer != b.target and runtime_of(os.path.basename(b.target)):
                    users.setdefault(b.target, set()).add(b.referrer)
                if b.referrer not in is_hook:
                    is_hook[b.referrer] = same_file(b.referrer, hook)
                if is_hook[b.referrer]:
                    if runtime_of(os.path.basename(b.target)) and b.target not in ev.hook_runtime:
                        ev.hook_runtime.append(b.target)
                elif b.symbol in symbols:
                    lib = libraries.setdefault(b.referrer, Library(b.referrer))
                    lib.bound.setdefault(b.symbol, b.target)
    return libraries


def _unbound(mapped: "Iterable[str]", soname: str, symbols: "frozenset[str]",
             libraries: "dict[str, Library]", ev: Evidence) -> None:
    """Add references the log never bound: interposed symbols a runtime-linked library needs."""
    for path in mapped:
        if same_file(path, ev.hook) or any(same_file(path, p) for p in libraries):
            continue
        try:
            if soname not in read_dynamic(path).needed:
                continue
            wanted = read_symbols(path).undefined & symbols
        except ElfError:
            continue
        if wanted:
            lib = libraries.setdefault(path, Library(path))
            for sym in sorted(wanted):
                lib.bound.setdefault(sym, None)


def _runtime_users(users: "dict[str, set[str]]", ev: Evidence) -> None:
    """``ev.bound_by`` for each mapped runtime library, and ``ev.idle``: where one copy takes bindings, each other
    copy that none does, with whence it comes and the fix (:func:`.document.second_runtime`)."""
    from .document import second_runtime

    for mapped in ev.runtimes:
        ev.bound_by[mapped] = sorted({who for target, whos in users.items() if same_file(target, mapped)
                                      for who in whos if not same_file(who, mapped)})
    taking = [r for r in ev.runtimes if ev.bound_by[r]]
    # Only beside the copy the plan binds for torch: a copy of torch's own runtime left idle while another
    # takes the calls is not harmless (torch then runs on a runtime its install did not bring).
    if len(taking) == 1 and same_file(taking[0], ev.runtime_library):
        ev.idle = [second_runtime(r, taking[0]) for r in ev.runtimes if not ev.bound_by[r]]


def _classify(lib: Library, ev: Evidence) -> None:
    targets = set(lib.bound.values())
    if None in targets:
        lib.status = "unbound"
        lib.reason = ("the loader bound no definition to it (a weak reference left unresolved), so the call "
                      "goes nowhere")
        return
    others = [t for t in targets if t is not None and not same_file(t, ev.hook)]  # None: returned above
    if not others:
        lib.status, lib.reason = "intercepted", "every reference binds to the hook"
        return
    lib.status = "bypassed"
    target = others[0]
    if runtime_of(os.path.basename(target)):
        if not ev.hook_mapped:
            lib.reason = f"bound to {target}: the hook is not loaded in this process (no LD_PRELOAD of it)"
        else:
            lib.reason = (f"bound to {target}, which its lookup scope puts before the hook: the library was "
                          f"opened with RTLD_DEEPBIND or linked with -Bsymbolic, or the hook is not in the "
                          f"global scope (preloaded or dlopen'ed RTLD_GLOBAL)")
    else:
        lib.reason = (f"bound to {target}, which defines it itself (a statically linked CUDA runtime): "
                      f"calls bound there never reach the hook")


def under_test(plan: "Plan", mode: str = "exec", as_is: bool = False,
               environ: "Mapping[str, str] | None" = None) -> "tuple[dict[str, str], str, str]":
    """(the child's environment, the hook it should bind to, that in words) for ``doctor --deep``.

    ``as_is``: ``environ`` (default: this process's) as it is, with the hook its LD_PRELOAD names (the
    plan's when it names none by an absolute path). ``mode`` "dlopen": the child starts as a flagged
    process in dlopen mode would, nothing of ours preloaded and no marker of an earlier resolve or
    exec, so that its own start-up hook loads the plan in-process. "exec": the plan's environment.
    """
    env = dict(os.environ if environ is None else environ)
    if as_is:
        named = [e for e in split_preload(env.get("LD_PRELOAD", "")) if is_tms_entry(e)]
        return env, named[0] if named and os.path.isabs(named[0]) else plan.build, "this environment as it is"
    if mode == "dlopen":
        env = {k: v for k, v in env.items() if k not in (STATE_VAR, EXEC_VAR)}
        env["LD_PRELOAD"] = ":".join(e for e in split_preload(env.get("LD_PRELOAD", "")) if not is_tms_entry(e))
        if not any(parse_flag(name, env.get(name))[0] for name in FLAG_VARS):
            env[GENERIC_FLAG] = "1"
        env.update({MODE_VAR: "dlopen", VERBOSE_VAR: "1"})
        return env, plan.build, "the plan, loaded in-process by the start-up hook (dlopen mode)"
    return {**env, **plan.environment()}, plan.build, "the plan"


def check(environ: "Mapping[str, str]", hook: str, runtime_library: str, *, module: str = "torch",
          executable: "str | None" = None, in_process: bool = False, timeout: float = 600,
          bound_fix: "str | None" = None) -> Evidence:
    """Start ``executable`` under ``environ`` plus :data:`DEEP_VARS`, import ``module``, and read the log.

    ``in_process``: ``environ`` asks the child's start-up hook for dlopen mode (with
    ``TMS_AUTOPRELOAD_VERBOSE``); a child whose hook re-exec'd it (:func:`tms_autopreload.environment.reexecuted`)
    gives evidence about exec mode, so the check fails with the hook's own words. ``bound_fix``: the fix to
    give where two runtime copies take bindings (the caller knows what it set up). The log goes to a private
    temporary directory, is read line by line and deleted. The calling process's environment is
    not touched. The child leads a process group of its own; whatever ends this call early (a
    timeout, Ctrl-C, an exception a signal handler raises) ends that group and deletes the log.
    """
    try:
        symbols = interposed(hook, runtime_library)
    except ElfError as exc:
        ev = Evidence(module, hook, runtime_library, ())
        ev.error = f"cannot read the symbol tables of {hook} and {runtime_library}: {exc}"
        return ev
    ev = Evidence(module, hook, runtime_library, symbols)
    ev.bound_fix = bound_fix
    if not symbols:
        ev.error = f"{os.path.basename(hook)} defines nothing that {os.path.basename(runtime_library)} defines"
        return ev
    soname = read_dynamic(runtime_library).soname or os.path.basename(runtime_library)
    directory = tempfile.mkdtemp(prefix="tms-autopreload-deep-")
    start = time.perf_counter()
    child = None
    try:
        env = {**environ, **DEEP_VARS, "LD_DEBUG_OUTPUT": os.path.join(directory, "bindings")}
        child = subprocess.Popen([executable or sys.executable, "-c", _PROBE, module], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            ev.error = f"`import {module}` did not finish within {timeout:g} s"
            return ev
        report = next((line for line in stdout.splitlines() if line.startswith(_MARK)), None)
        if child.returncode != 0 or report is None:
            tail = (stderr.strip().splitlines() or ["no output"])[-1]
            ev.error = f"the child failed before it could report (exit {child.returncode}): {tail}"
            return ev
        answer = json.loads(report[len(_MARK):])
        if not answer["maps"]:  # a process maps its executable at least: none seen, /proc/self/maps was not read
            ev.error = (f"the child could not read /proc/self/maps (is /proc mounted?), so what it maps after "
                        f"`import {module}` is unknown")
            return ev
        if in_process and answer["execd"]:
            said = [line for line in stderr.splitlines() if line.startswith("tms-autopreload:")]
            ev.error = ("the child did not load the hook in-process: "
                        f"{' / '.join(said) or 'its start-up hook said nothing'}")
            return ev
        return judge(ev, answer, directory, soname)
    finally:
        if child is not None and child.returncode is None:
            _end_group(child)
        ev.seconds = time.perf_counter() - start
        shutil.rmtree(directory, ignore_errors=True)


def judge(ev: Evidence, answer: "dict", directory: str, soname: str) -> Evidence:
    """Fill ``ev`` from what the child reported (``answer``: the files mapped after the import, ``maps``, and
    the import's error, ``import_error``) and from the loader's binding log files in ``directory``; ``soname``:
    the runtime library's, whose unbound references are looked for. Returns ``ev``."""
    mapped = answer["maps"]
    ev.hook_mapped = any(same_file(p, ev.hook) for p in mapped)
    ev.runtimes = [p for p in mapped if runtime_of(os.path.basename(p))]
    ev.import_error = answer["import_error"]
    if ev.import_error:
        return ev
    assert ev.hook is not None  # a plan's: check() judges only where there is one
    symbols = frozenset(ev.interposed)
    users: "dict[str, set[str]]" = {}
    libraries = _read_log(directory, ev.hook, symbols, ev, users)
    _runtime_users(users, ev)
    _unbound(mapped, soname, symbols, libraries, ev)
    for lib in libraries.values():
        # allocation before release, then by name: "cudaMalloc, cudaFree"
        lib.bound = dict(sorted(lib.bound.items(), key=lambda kv: ("alloc" not in kv[0].lower(), kv[0])))
        _classify(lib, ev)
    order = {ALLOCATOR: 0}
    ev.libraries = sorted(libraries.values(), key=lambda lib: (order.get(lib.name, 1), lib.name))
    return ev


def _end_group(child: "subprocess.Popen[str]") -> None:
    """End the child's process group (it and anything it started), then reap the child.

    Before the reap: until then the child's PID, which is the group's ID, cannot be reused.
    """
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()
