"""The package's one error model: every error it raises on purpose is an :class:`Error`.

An :class:`Error` carries three things, each for its own reader: ``message`` (what was found, for
a person), ``fix`` (what to do about it; every "Fix:" line the package prints comes from this
field) and ``cause`` (a short machine-readable word, listed in docs/reference.md, for code that
branches on data rather than on wording: scripts, ``doctor --json``, our own tests).

Every cause the package gives is named here once, and :data:`CAUSES` lists them all: the causes of
errors, and the causes of the resolver's verdicts on single candidates (``doctor --json``
``candidates[].cause``), which share one vocabulary (a build refused for ``no-driver`` makes an
error of ``no-driver`` when no other build fits).
"""

__all__ = ["Error", "ResolveError", "shown", "CAUSES"]

# Defaults, when a raise site names no more precise cause.
CAUSE_ERROR = "error"  # Error's default
CAUSE_NO_PLAN = "no-plan"  # ResolveError's default: no preload plan exists for this process

# Why no plan exists before any candidate is judged (tms_autopreload.decision, tms_autopreload.runtime).
CAUSE_NO_EXECUTABLE = "no-executable"  # sys.executable is empty
CAUSE_UNREADABLE_INTERPRETER = "unreadable-interpreter"  # the interpreter's ELF file cannot be read
CAUSE_INTERPRETER_FAILS = "interpreter-fails"  # the interpreter cannot be started for the loader's trace
CAUSE_ENV_TOO_LARGE = "env-too-large"  # the planned environment is over the kernel's exec limits (E2BIG)
CAUSE_BAD_FORCED_PATH = "bad-forced-path"  # TMS_AUTOPRELOAD_PATH names no preload build for this interpreter
CAUSE_NO_PACKAGE = "no-package"  # torch_memory_saver is not installed
CAUSE_NO_BUILDS = "no-builds"  # torch_memory_saver ships no preload build
CAUSE_TORCH_UNREADABLE = "torch-unreadable"  # torch's build files (torch/version.py) cannot be read
CAUSE_BAD_VERSION = "bad-version"  # a CUDA/HIP version (the override, or torch's) has no numeric major
CAUSE_CPU_ONLY_TORCH = "cpu-only-torch"  # torch is a CPU-only build
CAUSE_TORCH_INCONSISTENT = "torch-inconsistent"  # torch/version.py and the runtime torch links disagree
CAUSE_NO_RUNTIME_VISIBLE = "no-runtime-visible"  # no torch and no CUDA runtime visible
CAUSE_SEVERAL_RUNTIMES = "several-runtimes"  # no torch and more than one CUDA runtime visible
# Why no candidate gives a plan (the error), when every one that fits was refused for it.
CAUSE_UNTRUSTED_BUILDS = "untrusted-builds"  # every build that fits may be changed by others (the trust causes)
CAUSE_FORCED_DOES_NOT_FIT = "forced-does-not-fit"  # the build TMS_AUTOPRELOAD_PATH names does not fit
CAUSE_NO_BUILD_FITS = "no-build-fits"  # no installed build fits the runtime, or none that fits loads

# Verdicts on one candidate (and, for no-driver and no-binding, the error when every fitting build has it).
CAUSE_UNUSABLE = "unusable"  # not a preload build this interpreter can load (unreadable, another machine, ...)
CAUSE_WRONG_RUNTIME = "wrong-runtime"  # built for another runtime or major than this process uses
CAUSE_WORLD_WRITABLE = "world-writable"  # every user can write the file or replace it (tms_autopreload.trust)
CAUSE_UNTRUSTED_WRITER = "untrusted-writer"  # a user or group that cannot write this environment's code can
CAUSE_UNCHECKED = "unchecked"  # a component of its path could not be examined
CAUSE_UNSAFE_PATH = "unsafe-path"  # its path cannot be written in LD_PRELOAD (or LD_LIBRARY_PATH)
CAUSE_NO_DRIVER = "no-driver"  # the loader cannot find the NVIDIA driver library
CAUSE_NO_BINDING = "no-binding"  # no binding maps exactly torch's runtime copy and lets a child start
CAUSE_DOES_NOT_LOAD = "does-not-load"  # the real loader would not start the process with it
CAUSE_NOT_PRELOADED = "not-preloaded"  # the real loader did not preload it and said nothing
CAUSE_TWO_RUNTIMES = "two-runtimes"  # its runtime need would bind another copy than torch's
CAUSE_CHILD_FAILS = "child-fails"  # a non-Python child (/bin/sh, bash) would not start under the plan
CAUSE_NO_RUNTIME = "no-runtime"  # not tried: no runtime could be decided
CAUSE_PREFERRED_CHOSEN = "preferred-chosen"  # not tried: a preferred build was chosen first
CAUSE_LESS_PREFERRED = "less-preferred"  # it loads, but a preferred build was chosen

# Said with a plan (doctor's warnings, doctor --deep): what the process maps besides the one runtime the hook
# and torch share, or that they do not share one.
CAUSE_IDLE_RUNTIME = "idle-runtime"  # torch loads a second runtime copy by path (RTLD_LOCAL) that nothing binds to
CAUSE_SECOND_RUNTIME_BOUND = "second-runtime-bound"  # doctor --deep: not only torch's runtime copy takes bindings
CAUSE_SPLIT_RUNTIME = "split-runtime"  # an override makes the hook use another runtime than torch links
CAUSE_NOT_STARTED = "start-up-files"  # a start-up file of this package is missing, changed, shadowed, or not run

# Given by tms_autopreload.inprocess: why the plan cannot be, or was not, loaded in this running process.
CAUSE_IN_PROCESS = "in-process"  # InProcessError's default
CAUSE_TORCH_IMPORTED = "torch-imported"  # torch is already imported
CAUSE_RUNTIME_LOADED = "runtime-loaded"  # a GPU runtime library is already loaded
CAUSE_TORCH_LOADED = "torch-loaded"  # a torch library is already loaded
CAUSE_HOOK_LOADED = "hook-loaded"  # a torch_memory_saver build is already loaded
CAUSE_SYMBOL_DEFINED = "symbol-defined"  # a symbol the hook defines is already defined by a loaded object
CAUSE_DLOPEN_FAILED = "dlopen-failed"  # dlopen of the runtime library or the hook failed
CAUSE_NO_PROC_MAPS = "no-proc-maps"  # /proc/self/maps cannot be read to confirm the hook is mapped
CAUSE_NOT_MAPPED = "not-mapped"  # dlopen returned, but the hook is not mapped
CAUSE_NO_RUNTIME_FILE = "no-runtime-file"  # the plan names no runtime library file to load first
CAUSE_UNREADABLE_SYMBOLS = "unreadable-symbols"  # the hook's dynamic symbol table cannot be read
CAUSE_PRELOAD_DEFINES = "preload-defines"  # an LD_PRELOAD entry of this process defines what the hook defines
# Given by tms_autopreload.commands.kernelspec (tms-autopreload kernel).
CAUSE_NO_JUPYTER = "no-jupyter"  # jupyter_client is not installed
CAUSE_INVALID_REQUEST = "invalid-request"  # InvalidRequest's default: a kernel request refused as asked
CAUSE_NO_KERNEL = "no-kernel"  # no kernel of that name where uninstall looked
CAUSE_NOT_OURS = "not-ours"  # the kernel there was not written by this package
CAUSE_NO_IPYKERNEL = "no-ipykernel"  # ipykernel, which the kernel would run, is not installed
CAUSE_BAD_KERNEL_NAME = "bad-kernel-name"  # a kernel name Jupyter refuses
CAUSE_EMPTY_PREFIX = "empty-prefix"  # an empty --prefix, which names no directory
CAUSE_HOOK_OFF = "hook-off"  # the kernel's --env turns off the hook it exists for
# Given by tms_autopreload.commands.doctor.ray_cluster (doctor --ray).
CAUSE_NO_RAY = "no-ray"  # Ray is not installed for this interpreter
CAUSE_NO_CLUSTER = "no-cluster"  # no Ray cluster ever answered at the address
CAUSE_CLUSTER_LOST = "cluster-lost"  # the Ray cluster stopped answering during the preflight
CAUSE_RAY_TOKEN = "ray-token"  # Ray's token authentication stopped the connection: no token sent, none found, another
CAUSE_USAGE = "usage"  # an option refused before connecting

CAUSES = (
    CAUSE_ERROR, CAUSE_NO_PLAN, CAUSE_NO_EXECUTABLE, CAUSE_UNREADABLE_INTERPRETER, CAUSE_INTERPRETER_FAILS,
    CAUSE_ENV_TOO_LARGE, CAUSE_BAD_FORCED_PATH, CAUSE_NO_PACKAGE, CAUSE_NO_BUILDS, CAUSE_TORCH_UNREADABLE,
    CAUSE_BAD_VERSION, CAUSE_CPU_ONLY_TORCH, CAUSE_TORCH_INCONSISTENT, CAUSE_NO_RUNTIME_VISIBLE,
    CAUSE_SEVERAL_RUNTIMES, CAUSE_UNTRUSTED_BUILDS, CAUSE_FORCED_DOES_NOT_FIT, CAUSE_NO_BUILD_FITS,
    CAUSE_UNUSABLE, CAUSE_WRONG_RUNTIME, CAUSE_WORLD_WRITABLE, CAUSE_UNTRUSTED_WRITER, CAUSE_UNCHECKED,
    CAUSE_UNSAFE_PATH, CAUSE_NO_DRIVER, CAUSE_NO_BINDING, CAUSE_DOES_NOT_LOAD, CAUSE_NOT_PRELOADED,
    CAUSE_TWO_RUNTIMES, CAUSE_CHILD_FAILS, CAUSE_NO_RUNTIME, CAUSE_PREFERRED_CHOSEN, CAUSE_LESS_PREFERRED,
    CAUSE_IN_PROCESS, CAUSE_TORCH_IMPORTED, CAUSE_RUNTIME_LOADED, CAUSE_TORCH_LOADED, CAUSE_HOOK_LOADED,
    CAUSE_SYMBOL_DEFINED, CAUSE_DLOPEN_FAILED, CAUSE_NO_PROC_MAPS, CAUSE_NOT_MAPPED, CAUSE_NO_JUPYTER,
    CAUSE_INVALID_REQUEST, CAUSE_NO_KERNEL, CAUSE_NOT_OURS, CAUSE_NO_RAY, CAUSE_NO_CLUSTER, CAUSE_CLUSTER_LOST,
    CAUSE_RAY_TOKEN, CAUSE_USAGE, CAUSE_NO_RUNTIME_FILE, CAUSE_UNREADABLE_SYMBOLS, CAUSE_PRELOAD_DEFINES,
    CAUSE_NO_IPYKERNEL, CAUSE_BAD_KERNEL_NAME, CAUSE_EMPTY_PREFIX, CAUSE_HOOK_OFF, CAUSE_IDLE_RUNTIME,
    CAUSE_SECOND_RUNTIME_BOUND, CAUSE_SPLIT_RUNTIME, CAUSE_NOT_STARTED,
)


class Error(Exception):
    """The base of every error the package raises on purpose.

    Subclasses name the part that raised it and give ``cause`` a default; a raise site may give a
    more precise cause. ``str()`` is the message followed by its fix, as a person reads it: after
    ". Fix: ", or on a line of its own after a message of several lines (one that lists candidates).
    """

    cause: str = CAUSE_ERROR

    def __init__(self, message: str, fix: "str | None" = None, cause: "str | None" = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        if cause is not None:
            self.cause = cause

    def __str__(self) -> str:
        if self.fix is None:
            return self.message
        sep = "\n" if "\n" in self.message else ". "
        return f"{self.message}{sep}Fix: {self.fix}"


class ResolveError(Error, RuntimeError):
    """No preload plan exists for this process (a RuntimeError too, as it was before the base).

    ``report`` holds the full survey (a :class:`tms_autopreload.decision.Report`: the runtime, every candidate
    with its verdict) when one was made, so that a caller of :func:`tms_autopreload.resolve` can show it.
    Typed ``object`` here: the error model sits below the decision, which imports it.
    """

    cause = CAUSE_NO_PLAN

    def __init__(self, message: str, report: object = None, *, fix: "str | None" = None,
                 cause: "str | None" = None) -> None:
        super().__init__(message, fix, cause)
        self.report = report


# How much of a path or a search path a message quotes: whole, as the user copies it, however deep its
# environment (a conda env's site-packages, a cluster's module tree); a longer value is no real path.
PATH_SHOWN = 1024
# How much of any other value a message quotes (a version, a flag's word): more than any real one.
VALUE_SHOWN = 60


def shown(value: str, limit: int = VALUE_SHOWN) -> str:
    """``value`` as a message quotes it: repr, and cut with its length when longer than ``limit`` (a
    path's: :data:`PATH_SHOWN`), so that a garbage value cannot flood the message."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"
