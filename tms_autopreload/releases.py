"""torch_memory_saver's releases: their preload builds, which read ``LD_PRELOAD`` as one path, how to reinstall.

As this package knows them, in one table (:data:`RELEASES`): every other module asks here; a new release is
one row here. The file names of the builds are :mod:`tms_autopreload.builds`' (by which they are found):

* 0.0.6, 0.0.8: ``torch_memory_saver_cpp.abi3.so`` (driver only: libcuda.so.1);
* 0.0.9: ``torch_memory_saver_hook_mode_preload.abi3.so`` (libcudart.so.12);
* 0.0.9.post1, 0.0.10: ``..._preload_cu12``, ``..._preload_cu13`` and an unsuffixed copy of cu12;
* source builds: one unsuffixed build of whichever major it was built for.

Wheels put them in site-packages itself, the directory above the package; source builds may put them in the
package directory. ``..._hook_mode_torch*`` builds are pluggable allocators, not preload hooks. Two rules of
its Python side are the environment's, which the start-up entry needs (:mod:`tms_autopreload.environment`:
``is_tms_entry``, which entry is one of its builds; ``compose_preload``, the one value its check accepts).

Reinstalling: a fix must install something, and ``pip install torch-memory-saver`` over an installed release
answers "Requirement already satisfied", so the release is forced again. Where pip recorded the source (PEP
610's ``direct_url.json``: a wheel file, a checkout, editable or not, a VCS URL) and it is still there, that
source; a build of one's own (a ``+local`` version) without one is said in words, the index does not have it.
Where this environment's pip would not touch the copy (a ``pip install --target`` folder on ``PYTHONPATH``),
the command installs into that folder again. Only a build file that is gone, or whose size is not the one
pip recorded (an emptied or cut file), counts as damaged: a file of the right size is the loader's to judge.

Asked where a fact is needed, not on import: a flagged start whose plan binds without preloading the
runtime by path never imports this module (each module costs that start about 0.2 ms here).
"""

import os

from .environment import read_regular
from .builds import DRIVER_ONLY_PREFIX, is_preload_name, named_major
from .gpu_libraries import CUDA, DRIVER_SONAME, HIP, release

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib import metadata
    from typing import Any

__all__ = ["reinstall_hint", "build_install_hint", "installed_version", "reads_one_path", "install_fix",
           "splitting_install", "Release", "RELEASES", "RELEASED_CUDA_MAJORS", "ONE_PATH_RELEASES", "REINSTALL"]

TMS_DISTRIBUTION = "torch-memory-saver"
# How to get back its files where pip's record says nothing of them.
REINSTALL = "reinstall torch-memory-saver"


class Release:
    """One torch_memory_saver release: the CUDA majors it ships a preload build for, the major of its build
    without a ``_cu`` suffix (None: it has none), whether its build links only the driver, and whether its
    Python side splits ``LD_PRELOAD`` on ':' (0.0.8's ``_BinaryInfo.compute`` and 0.0.9/0.0.9.post1's
    ``HookUtilModePreload.get_path_binary`` pass the whole value to ``ctypes.CDLL``; 0.0.10 splits it and wants
    exactly one entry naming it)."""

    __slots__ = ("version", "majors", "unsuffixed", "driver_only", "splits_preload")

    def __init__(self, version: str, majors: "tuple[int, ...]", unsuffixed: "int | None", driver_only: bool,
                 splits_preload: bool) -> None:
        self.version = version
        self.majors = majors
        self.unsuffixed = unsuffixed
        self.driver_only = driver_only
        self.splits_preload = splits_preload


# The releases this package knows, oldest first (each checked against its wheel on PyPI).
RELEASES = (
    Release("0.0.8", majors=(), unsuffixed=None, driver_only=True, splits_preload=False),
    Release("0.0.9", majors=(12,), unsuffixed=12, driver_only=False, splits_preload=False),
    Release("0.0.9.post1", majors=(12, 13), unsuffixed=12, driver_only=False, splits_preload=False),
    Release("0.0.10", majors=(12, 13), unsuffixed=12, driver_only=False, splits_preload=True),
)
# The majors a torch_memory_saver release ships a build for: also the runtimes probed where no torch says which.
RELEASED_CUDA_MAJORS = tuple(sorted({m for r in RELEASES for m in r.majors}))
# The first release whose Python side splits LD_PRELOAD, and those before it, in words.
_SPLITS_SINCE = release(next(r.version for r in RELEASES if r.splits_preload))
ONE_PATH_RELEASES = f"{[r for r in RELEASES if not r.splits_preload][-1].version} and older"


def _first_for(major: int) -> Release:
    """The first release that ships a build for CUDA ``major`` (one of :data:`RELEASED_CUDA_MAJORS`)."""
    return next(r for r in RELEASES if major in r.majors)


def install_fix(torch_dir: "str | None") -> str:
    """The command that installs torch_memory_saver into this environment, beside torch where the survey
    found it (``torch_dir``; None: no torch): the installer decides what that asks of pip (the user site)."""
    from .installer import pip_command

    return pip_command("install", TMS_DISTRIBUTION,
                       beside=os.path.dirname(os.path.abspath(torch_dir)) if torch_dir else None)


def splitting_install(package_dir: "str | None") -> str:
    """The command that installs a release whose check splits LD_PRELOAD on ':' (:data:`_SPLITS_SINCE`) where
    the installed one at ``package_dir`` lies (its ``--target`` folder, the user site)."""
    from .installer import pip_command

    site = os.path.dirname(os.path.abspath(package_dir)) if package_dir else None
    return pip_command("install", f"{TMS_DISTRIBUTION}>={'.'.join(map(str, _SPLITS_SINCE))}", site=site)


def _is_it(dist: "metadata.Distribution") -> bool:
    """Whether ``dist`` is torch-memory-saver as an installer recorded it (a ``RECORD``: not the ``.egg-info``
    a source tree holds)."""
    return ((dist.metadata["Name"] or "").lower().replace("_", "-") == TMS_DISTRIBUTION
            and dist.read_text("RECORD") is not None)


def _distribution(package_dir: str) -> "tuple[metadata.Distribution, str] | None":
    """(the distribution that installed the torch_memory_saver package at ``package_dir``, the directory it is
    installed in): pip's record beside the package, or an editable install's whose checkout holds it."""
    from importlib import metadata

    from .install_source import local_path, record_of

    site = os.path.dirname(os.path.abspath(package_dir))
    here = [dist for dist in metadata.distributions(path=[site]) if _is_it(dist)]
    if here:  # more than one where `pip install --target DIR --upgrade` left the old record: the files say which
        return min(here, key=_unlike), site
    for dist in metadata.distributions():
        record = record_of(dist) if _is_it(dist) else None
        if record and _editable(record) and (local_path(record) or "") == site:
            return dist, str(dist.locate_file(""))
    return None


def _recorded(dist: "metadata.Distribution") -> "list[tuple[str, str, int | None]]":
    """(file name, its path, the size pip recorded or None) of each file ``dist``'s RECORD lists, gone ones too:
    from Python 3.12 on, ``Distribution.files`` leaves out the files that are gone, the very ones a damaged
    install lacks."""
    import csv

    out = []
    for row in csv.reader((dist.read_text("RECORD") or "").splitlines()):
        if row and row[0]:
            size = row[2] if len(row) > 2 else ""
            out.append((os.path.basename(row[0]), str(dist.locate_file(row[0])), int(size) if size.isdigit() else None))
    return out


def _unlike(dist: "metadata.Distribution") -> int:
    """How many of the files ``dist``'s RECORD lists, preload builds aside (they may be what is damaged), are
    gone or not the size it recorded: 0 for the release whose files are there."""
    return sum(1 for name, path, size in _recorded(dist) if size is not None and not is_preload_name(name) and
               (not os.path.isfile(path) or os.path.getsize(path) != size))


def _editable(record: "dict[str, Any]") -> bool:
    info = record.get("dir_info")
    return isinstance(info, dict) and bool(info.get("editable"))


def _damage(dist: "metadata.Distribution") -> "list[tuple[str, str]]":
    """(file name, what is wrong with it) of each preload build pip's RECORD lists that is gone or not the
    size it recorded."""
    out = []
    for name, path, size in _recorded(dist):
        if not is_preload_name(name):
            continue
        if not os.path.lexists(path):
            out.append((name, "is missing"))
        elif size is not None and os.path.getsize(path) != size:
            out.append((name, f"is damaged ({os.path.getsize(path)} bytes, where pip installed {size})"))
    return out


def _may_be_for(name: str, major: "int | None") -> bool:
    """Whether a build of this name, by the releases' naming, may be the one for CUDA ``major`` (None: any):
    its ``_cu<major>`` suffix; without one, the major of a release's unsuffixed build; the driver-only
    build, any."""
    if major is None or named_major(name) == major or name.startswith(DRIVER_ONLY_PREFIX):
        return True
    return named_major(name) is None and major in {r.unsuffixed for r in RELEASES}


def _command(dist: "metadata.Distribution", site: str) -> str:
    """What installs this copy again, where it lies: its recorded source while that is there, else its
    release from the index; a local build without a record, in words."""
    from .installer import pip_command
    from .install_source import record_of, source_args, source_gone

    record = record_of(dist)
    if record is not None and not source_gone(record):
        args = source_args(record)
        if args:
            return pip_command("install", *args, site=site, reinstall=True)
    version = dist.version
    if "+" in version:
        return (f"reinstall it from the source it was built from (its version's local label, "
                f"+{version.partition('+')[2]}, names a build the package index does not have)")
    return pip_command("install", f"{TMS_DISTRIBUTION}=={version}", site=site, reinstall=True)


def reinstall_hint(package_dir: "str | None", major: "int | None" = None) -> "str | None":
    """The fix that puts back the installed release's gone or damaged preload builds (those that may be for
    CUDA ``major``; None: any), or None when pip's record shows none: what is wrong, then the command. An
    editable install's builds lie in its checkout, which pip's record does not list: where that checkout
    holds no preload build, it is rebuilt."""
    found = _distribution(package_dir) if package_dir else None
    if found is None:
        return None
    dist, site = found
    damage = [f"{name} {wrong}" for name, wrong in _damage(dist) if _may_be_for(name, major)]
    if damage:
        return f"{TMS_DISTRIBUTION} {dist.version} is installed but its {', '.join(damage)}: {_command(dist, site)}"
    from .install_source import record_of

    checkout = os.path.dirname(os.path.abspath(package_dir or ""))
    record = record_of(dist)
    if record is not None and _editable(record) and not any(
            is_preload_name(n) for d in (checkout, os.path.join(checkout, "torch_memory_saver")) for n in _names(d)):
        return (f"{TMS_DISTRIBUTION} {dist.version} is installed editable from {checkout}, which holds no preload "
                f"build (cleaned since it was built): {_command(dist, site)}")
    return None


def _names(directory: str) -> "list[str]":
    try:
        return os.listdir(directory)
    except OSError:
        return []


def build_install_hint(kind: str, major: int, package_dir: "str | None" = None) -> str:
    """The torch_memory_saver to install when no installed build fits ``kind`` ``major``: the installed
    release again where its builds were removed, else only what a release ships, or how to build it."""
    reinstall = reinstall_hint(package_dir, major) if kind == CUDA else None
    if reinstall:
        return reinstall
    if kind == HIP:
        return "install a ROCm build of torch_memory_saver (built from source with ROCm)"
    from .installer import pip_command

    site = os.path.dirname(os.path.abspath(package_dir)) if package_dir else None
    if major in RELEASED_CUDA_MAJORS:
        first = _first_for(major).version
        return (f"install a torch_memory_saver that ships a CUDA {major} build ({first} and later ship one): "
                f"{pip_command('install', f'{TMS_DISTRIBUTION}>={first}', site=site)}")
    driver_only = next(r.version for r in RELEASES if r.driver_only)
    return (f"no torch_memory_saver release ships a CUDA {major} build (releases ship CUDA "
            f"{' and '.join(map(str, RELEASED_CUDA_MAJORS))} builds); torch_memory_saver {driver_only}'s build needs "
            f"only the driver ({DRIVER_SONAME}), not a CUDA {major} runtime: "
            f"{pip_command('install', f'{TMS_DISTRIBUTION}=={driver_only}', site=site)}")


def installed_version(package_dir: str) -> "tuple[int, ...] | None":
    """The release of the torch_memory_saver distribution installed with ``package_dir``: the ``Version`` of
    the one ``torch_memory_saver-*.dist-info`` beside it (its installer's record); None when there is not
    exactly one, or it states none."""
    site = os.path.dirname(package_dir)
    try:
        found = [n for n in os.listdir(site)
                 if n.lower().startswith("torch_memory_saver-") and n.endswith(".dist-info")]
        if len(found) != 1:
            return None
        head = read_regular(os.path.join(site, found[0], "METADATA"), 1 << 16).decode("utf-8", "replace")
    except OSError:
        return None
    version = next((line[len("Version:"):] for line in head.split("\n") if line.startswith("Version:")), "")
    return release(version) or None


def reads_one_path(package_dir: str | None) -> bool:
    """True when torch_memory_saver's Python side needs LD_PRELOAD to be exactly one path.

    Decided by the installed distribution's version against :data:`_SPLITS_SINCE`. A tree with no
    metadata beside it (copied into place, or an editable source tree) has no version to go by: then
    its code decides, by whether ``hooks/mode_preload.py`` splits the value with ``.split(":")``. That
    is wording, checked against 0.0.8 (no such file), 0.0.9 and 0.0.9.post1 (no split), 0.0.10 and a
    source build of upstream #108 (the split); another spelling of the split reads as one path, the
    cautious answer.
    """
    if package_dir is None:
        return False
    release = installed_version(package_dir)
    if release is not None:
        return release < _SPLITS_SINCE
    try:
        return b'.split(":")' not in read_regular(os.path.join(package_dir, "hooks", "mode_preload.py"), 1 << 20)
    except OSError:
        return True
