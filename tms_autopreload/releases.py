"""torch_memory_saver's releases: their preload builds, and which read ``LD_PRELOAD`` as one path.

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
How to get a release's builds back is :mod:`tms_autopreload.reinstall`'s.

Asked where a fact is needed, not on import: a flagged start whose plan binds without preloading the
runtime by path never imports this module (each module costs that start about 0.2 ms here).
"""

import os

from .environment import read_regular
from .gpu_libraries import release

__all__ = ["installed_version", "reads_one_path", "install_fix", "splitting_install", "first_for", "Release",
           "RELEASES", "RELEASED_CUDA_MAJORS", "ONE_PATH_RELEASES", "TMS_DISTRIBUTION"]

TMS_DISTRIBUTION = "torch-memory-saver"


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


def first_for(major: int) -> Release:
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
