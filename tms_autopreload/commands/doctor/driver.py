"""The NVIDIA driver a process would run on: the kernel module, the ``libcuda.so.1`` it binds, what it runs.

The user-space ``libcuda.so.1`` the loader binds, and the newest CUDA major they run.

A torch built for a newer CUDA major than the driver runs loads fine (the loader only needs a file
named ``libcuda.so.1``) and fails at its first CUDA call (``torch.cuda.is_available()`` is False), so
the start-up hook never refuses on these facts; ``doctor`` reports them, with a verdict and the fix.

* The kernel module's version is the first line of ``/proc/driver/nvidia/version``
  (``NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  ...``; the open modules write
  ``NVIDIA UNIX Open Kernel Module for <uname -m>  <version>  ...``, so ``... for aarch64 ...`` on Grace
  machines). Containers and machines without a GPU have no such file: the module is then unknown, which
  alone never fails.
* NVIDIA installs the user-space driver as ``libcuda.so.1 -> libcuda.so.<version>``; the version is
  read from the real file's name, after the loader's search (:class:`tms_autopreload.ldso.Loader`,
  with ``LD_PRELOAD`` first: a preloaded ``libcuda.so.1`` satisfies every later need of that SONAME).
* NVIDIA's forward-compatibility package (``cuda-compat-<major>-<minor>``) is a newer ``libcuda.so.1``
  that runs a newer CUDA major on an older kernel module; it must be reached first, through
  ``LD_LIBRARY_PATH`` or ``LD_PRELOAD``. Any other difference between module and library is the
  "Driver/library version mismatch" the driver itself reports.
"""

import os

from ...environment import read_regular
from ...errors import CAUSE_NO_DRIVER, Error
from ...ldso import PRELOADED, Loader
from ...gpu_libraries import CUDA_MAJORS, DRIVER_FILE_PREFIX, DRIVER_SONAME

__all__ = ["MODULE_VERSION_FILE", "MINIMUM_DRIVER", "DriverFacts", "parse_module_version", "version_key",
           "newest_major", "examine", "OK", "FAILING", "NOT_FOUND", "UNKNOWN"]

# The verdicts on a driver (``doctor --json``'s ``driver.verdict``): it runs torch's CUDA, it cannot, the loader
# finds no driver library and that is why the process has no plan, or nothing says either way (which fails
# nothing).
OK, FAILING, NOT_FOUND, UNKNOWN = "ok", "failing", "not-found", "unknown"

MODULE_VERSION_FILE = "/proc/driver/nvidia/version"
LIBCUDA = DRIVER_SONAME
# The oldest driver that runs each CUDA major (minor-version compatibility): gpu_libraries.CUDA_MAJORS, with its
# source.
MINIMUM_DRIVER = {major: row.minimum_driver for major, row in CUDA_MAJORS.items()}
# Where a library found first is forward compatibility rather than the installed driver.
_COMPAT_RULES = (PRELOADED, "LD_LIBRARY_PATH")


def version_key(version: str) -> "tuple[int, ...] | None":
    """``535.104.05`` -> (535, 104, 5); None unless dot-separated ASCII numbers (1-3 parts, each 1-6 digits)."""
    parts = version.split(".")
    if not 1 <= len(parts) <= 3 or not all(0 < len(p) <= 6 and p.isascii() and p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def parse_module_version(text: str) -> "str | None":
    """The kernel module's version from ``/proc/driver/nvidia/version``: the first version-shaped word
    after ``Kernel Module`` on the ``NVRM version:`` line (proprietary and open modules both say so)."""
    for line in text.splitlines():
        if not line.startswith("NVRM version:"):
            continue
        words = line.split()
        for i, word in enumerate(words):
            if word == "Module":
                found = next((w for w in words[i + 1:] if version_key(w) is not None and "." in w), None)
                if found is not None:
                    return found
        return None
    return None


def newest_major(driver_version: str) -> "int | None":
    """The newest CUDA major a driver of this version runs (minor-version compatibility), or None."""
    key = version_key(driver_version)
    if key is None:
        return None
    fits = [major for major, minimum in MINIMUM_DRIVER.items() if key >= (version_key(minimum) or ())]
    return max(fits) if fits else None


def _read_module_version(path: str) -> "tuple[str | None, str]":
    """(version, what was read): the version, or None with why (no file, unreadable, not understood)."""
    try:
        text = read_regular(path, 4096).decode("utf-8", "replace")
    except FileNotFoundError:
        return None, f"{path} does not exist (no NVIDIA kernel module loaded, or a container without it)"
    except OSError as exc:
        return None, f"cannot read {path} ({exc.strerror or exc})"
    version = parse_module_version(text)
    return version, (path if version else f"{path} names no version")


def _library_version(path: str) -> "str | None":
    """The version in the real file's name, ``libcuda.so.<version>``, after resolving symlinks."""
    name = os.path.basename(os.path.realpath(path))
    if not name.startswith(DRIVER_FILE_PREFIX):
        return None
    version = name[len(DRIVER_FILE_PREFIX):]
    return version if version_key(version) is not None and "." in version else None


def _find_libcuda(loader: Loader) -> "tuple[str | None, str | None]":
    """(path, rule): the ``libcuda.so.1`` this process binds, as the loader finds it: an object LD_PRELOAD
    loaded whose SONAME is ``libcuda.so.1`` first (it satisfies every later need of that name), then its
    search. ``loader`` must be built with this process's LD_PRELOAD."""
    found = loader.find(LIBCUDA)
    return (found.path, found.rule) if found else (None, None)


class DriverFacts:
    """What was found, and the verdict for a process whose torch needs CUDA ``wanted``. ``examine`` fills
    the facts; ``verdict`` (:data:`OK`, :data:`FAILING` or :data:`UNKNOWN`), ``message`` and ``fix`` are its
    judgement."""

    __slots__ = ("module_version", "module_source", "library", "library_rule", "library_version",
                 "newest_major", "wanted", "compat", "verdict", "message", "fix")

    def __init__(self, *, module_version: "str | None", module_source: str, library: "str | None",
                 library_rule: "str | None", library_version: "str | None", newest_major: "int | None",
                 wanted: "int | None", compat: bool, verdict: str = UNKNOWN, message: "str | None" = None,
                 fix: "str | None" = None) -> None:
        self.module_version = module_version
        self.module_source = module_source
        self.library = library
        self.library_rule = library_rule
        self.library_version = library_version
        self.newest_major = newest_major
        self.wanted = wanted
        self.compat = compat
        self.verdict = verdict
        self.message = message
        self.fix = fix

    def to_dict(self) -> "dict[str, object]":
        """The facts under their slot names, in slot order (``doctor --json``'s ``driver`` object)."""
        return {name: getattr(self, name) for name in self.__slots__}


def examine(loader: Loader, wanted: "int | None", module_file: str = MODULE_VERSION_FILE,
            stop: "Error | None" = None) -> DriverFacts:
    """The driver facts of a process whose loader view is ``loader`` (its LD_LIBRARY_PATH and LD_PRELOAD),
    judged for CUDA major ``wanted`` (None: not a CUDA process, no verdict on majors). ``stop``: why that
    process has no plan (None: it has one); where its cause is the driver library the loader cannot find
    (:data:`~tms_autopreload.errors.CAUSE_NO_DRIVER`), a missing ``libcuda.so.1`` is :data:`NOT_FOUND`, with
    that error's fix, else it judges nothing. Never raises for what it finds."""
    module, module_source = _read_module_version(module_file)
    library, rule = _find_libcuda(loader)
    real = os.path.realpath(library) if library else None
    lib_version = _library_version(library) if library else None
    compat = bool(lib_version and module and rule in _COMPAT_RULES
                  and (version_key(lib_version) or ()) > (version_key(module) or ()))
    # What decides the CUDA majors: the forward-compatibility library when it is in place, else the
    # installed driver (the module, which the library must match; the library when the module is unknown).
    deciding = lib_version if compat else (module or lib_version)
    newest = newest_major(deciding) if deciding else None
    facts = DriverFacts(module_version=module, module_source=module_source, library=real, library_rule=rule,
                        library_version=lib_version, newest_major=newest, wanted=wanted, compat=compat)
    if library is None:
        facts.message = (f"no {LIBCUDA} is found by the loader (LD_PRELOAD, LD_LIBRARY_PATH, /etc/ld.so.cache, "
                         f"the default directories)")
        if stop is not None and stop.cause == CAUSE_NO_DRIVER:
            facts.verdict, facts.fix = NOT_FOUND, stop.fix
            facts.message += ", and every build that fits needs it: that is why there is no plan"
        return facts
    if module and lib_version and lib_version != module and not compat:
        facts.verdict = FAILING
        facts.message = (f"Driver/library version mismatch: the NVIDIA kernel module is {module} but the "
                         f"user-space driver the loader binds is {lib_version} ({real}, via {rule})")
        facts.fix = ("reboot (or reload the nvidia kernel module) after a driver upgrade, or mount the host's "
                     f"own {DRIVER_FILE_PREFIX}{module} into the container; a forward-compatibility libcuda must be "
                     "newer than the module and come first on LD_LIBRARY_PATH")
        return facts
    minimum = MINIMUM_DRIVER.get(wanted) if wanted is not None else None
    if deciding is not None and (wanted is None or minimum is None):
        runs = f"CUDA {newest}.x at most" if newest else "no CUDA major this package knows"
        why = ("no CUDA runtime was decided for this process (see the plan's error), so there is no CUDA major to "
               "judge it against" if wanted is None else f"this package knows no minimum driver for CUDA {wanted}")
        facts.message = f"driver {deciding} runs {runs}; not judged: {why}"
        return facts
    if deciding is None or wanted is None or minimum is None:
        facts.message = ("driver version unknown: " + "; ".join(
            [module_source if not module else f"kernel module {module}",
             f"{real} has no version in its name" if not lib_version else f"libcuda {lib_version}"]))
        return facts
    if newest is None or newest < wanted:
        facts.verdict = FAILING
        runs = f"CUDA {newest}.x at most" if newest else "no CUDA major this package knows"
        facts.message = (f"the NVIDIA driver {deciding} runs {runs}, but torch is built for CUDA {wanted}, "
                         f"which needs a driver >= {minimum}: every CUDA call fails "
                         f"(torch.cuda.is_available() is False)")
        facts.fix = (f"upgrade the NVIDIA driver to >= {minimum}, or install NVIDIA's forward-compatibility "
                     f"package for CUDA {wanted} (cuda-compat-{wanted}-<minor>) and put its directory first "
                     f"on LD_LIBRARY_PATH")
        return facts
    facts.verdict = OK
    if compat:
        facts.message = (f"forward compatibility: {real} (libcuda {lib_version}, via {rule}) runs CUDA "
                         f"{newest}.x on kernel module {module}; torch and the hook bind this one libcuda")
    else:
        facts.message = f"driver {deciding} runs CUDA {newest}.x (>= {minimum} needed for CUDA {wanted})"
    return facts
