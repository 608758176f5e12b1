"""How to get torch_memory_saver's builds back: the installed release again, or a release that ships one.

A fix must install something, and ``pip install torch-memory-saver`` over an installed release answers
"Requirement already satisfied", so the release is forced again. Where pip recorded the source (PEP 610's
``direct_url.json``: a wheel file, a checkout, editable or not, a VCS URL) and it is still there, that source; a
build of one's own (a ``+local`` version) without one is said in words, the index does not have it. Where this
environment's pip would not touch the copy (a ``pip install --target`` folder on ``PYTHONPATH``), the command
installs into that folder again. Only a build file that is gone, or whose size is not the one pip recorded (an
emptied or cut file), counts as damaged: a file of the right size is the loader's to judge. Where no installed
release can give a fitting build back, the release to install (:mod:`tms_autopreload.releases`' table).

Asked only where no installed build fits: a flagged start with a plan never imports this module.
"""

import os

from .builds import DRIVER_ONLY_PREFIX, is_preload_name, named_major
from .gpu_libraries import CUDA, DRIVER_SONAME, HIP
from .releases import RELEASED_CUDA_MAJORS, RELEASES, TMS_DISTRIBUTION, first_for

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib import metadata
    from typing import Any

__all__ = ["reinstall_hint", "build_install_hint", "REINSTALL"]

# How to get back its files where pip's record says nothing of them.
REINSTALL = "reinstall torch-memory-saver"


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
        first = first_for(major).version
        return (f"install a torch_memory_saver that ships a CUDA {major} build ({first} and later ship one): "
                f"{pip_command('install', f'{TMS_DISTRIBUTION}>={first}', site=site)}")
    driver_only = next(r.version for r in RELEASES if r.driver_only)
    return (f"no torch_memory_saver release ships a CUDA {major} build (releases ship CUDA "
            f"{' and '.join(map(str, RELEASED_CUDA_MAJORS))} builds); torch_memory_saver {driver_only}'s build needs "
            f"only the driver ({DRIVER_SONAME}), not a CUDA {major} runtime: "
            f"{pip_command('install', f'{TMS_DISTRIBUTION}=={driver_only}', site=site)}")
