"""What to install where no torch_memory_saver build fits: the installed distribution again, as pip recorded
it (which of its preload builds are gone or damaged, and the one command that puts them back where that copy
lies), else the release that ships a build for the runtime. Asked only when a survey fails, so off the
start-up path.

A fix must install something: ``pip install torch-memory-saver`` over an installed release answers
"Requirement already satisfied", so the same release is forced again. Where pip recorded the source (PEP
610's ``direct_url.json``: a wheel file, a checkout, editable or not, a VCS URL) and it is still there, that
source; a build of one's own (a ``+local`` version) without one is said in words, the index does not have it.
Where this environment's pip would not touch the copy (a ``pip install --target`` folder on ``PYTHONPATH``),
the command installs into that folder again. Only a build file that is gone, or whose size is not the one
pip recorded (an emptied or cut file), counts as damaged: a file of the right size is the loader's to judge.
"""

import os
import shlex
from importlib import metadata

from .builds import PRELOAD_PREFIXES
from .origin import command_from, local_path, record_of, source_gone
from .sonames import DRIVER_SONAME, RELEASED_CUDA_MAJORS
from .wheels import pip_refusal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["build_install_hint", "reinstall_hint"]

DISTRIBUTION = "torch-memory-saver"


def _is_it(dist: metadata.Distribution) -> bool:
    """Whether ``dist`` is torch-memory-saver as an installer recorded it (a ``RECORD``: not the ``.egg-info``
    a source tree holds)."""
    return ((dist.metadata["Name"] or "").lower().replace("_", "-") == DISTRIBUTION
            and dist.read_text("RECORD") is not None)


def _distribution(package_dir: str) -> "tuple[metadata.Distribution, str] | None":
    """(the distribution that installed the torch_memory_saver package at ``package_dir``, the directory it is
    installed in): pip's record beside the package, or an editable install's whose checkout holds it."""
    site = os.path.dirname(os.path.abspath(package_dir))
    for dist in metadata.distributions(path=[site]):
        if _is_it(dist):
            return dist, site
    for dist in metadata.distributions():
        record = record_of(dist) if _is_it(dist) else None
        if record and _editable(record) and (local_path(record) or "") == site:
            return dist, str(dist.locate_file(""))
    return None


def _editable(record: "dict[str, Any]") -> bool:
    info = record.get("dir_info")
    return isinstance(info, dict) and bool(info.get("editable"))


def _damage(dist: metadata.Distribution) -> "list[str]":
    """Each preload build pip's RECORD lists that is gone or not the size it recorded, said as such."""
    out = []
    for f in dist.files or ():
        if not (f.name.startswith(PRELOAD_PREFIXES) and f.name.endswith(".so")):
            continue
        path = str(dist.locate_file(f))
        if not os.path.lexists(path):
            out.append(f"{f.name} is missing")
        elif f.size is not None and os.path.getsize(path) != f.size:
            out.append(f"{f.name} is damaged ({os.path.getsize(path)} bytes, where pip installed {f.size})")
    return out


def _may_be_for(name: str, major: "int | None") -> bool:
    """Whether a build of this name, by the releases' naming, may be the one for CUDA ``major`` (None: any):
    ``_cu<major>``; unsuffixed, the CUDA 12 build (0.0.9 to 0.0.10); ``torch_memory_saver_cpp``, driver only."""
    if major is None or f"_cu{major}." in name or name.startswith("torch_memory_saver_cpp"):
        return True
    return "_cu" not in name and major == 12


def _command(dist: metadata.Distribution, site: str) -> str:
    """What installs this copy again, where it lies: its recorded source while that is there, else its
    release from the index; a local build without a record, in words."""
    target = f" --target {shlex.quote(site)} --upgrade" if pip_refusal(site) else ""
    record = record_of(dist)
    if record is not None and not source_gone(record):
        command = command_from(record, f"--force-reinstall{target}")
        if command:
            return command
    version = dist.version
    if "+" in version:
        return (f"reinstall it from the source it was built from (its version's local label, "
                f"+{version.partition('+')[2]}, names a build the package index does not have)")
    return f"pip install --force-reinstall{target} {DISTRIBUTION}=={version}"


def reinstall_hint(package_dir: "str | None", major: "int | None" = None) -> "str | None":
    """The fix that puts back the installed release's gone or damaged preload builds (those that may be for
    CUDA ``major``; None: any), or None when pip's record shows none: what is wrong, then the command. An
    editable install's builds lie in its checkout, which pip's record does not list: where that checkout
    holds no preload build, it is rebuilt."""
    found = _distribution(package_dir) if package_dir else None
    if found is None:
        return None
    dist, site = found
    damage = [d for d in _damage(dist) if _may_be_for(d.split(" ", 1)[0], major)]
    if damage:
        return f"{DISTRIBUTION} {dist.version} is installed but its {', '.join(damage)}: {_command(dist, site)}"
    checkout = os.path.dirname(os.path.abspath(package_dir or ""))
    record = record_of(dist)
    if record is not None and _editable(record) and not any(
            n.startswith(PRELOAD_PREFIXES) and n.endswith(".so")
            for d in (checkout, os.path.join(checkout, "torch_memory_saver")) for n in _names(d)):
        return (f"{DISTRIBUTION} {dist.version} is installed editable from {checkout}, which holds no preload "
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
    reinstall = reinstall_hint(package_dir, major) if kind == "cuda" else None
    if reinstall:
        return reinstall
    if kind == "hip":
        return "install a ROCm build of torch_memory_saver (built from source with ROCm)"
    if major in RELEASED_CUDA_MAJORS:
        return (f"install a torch_memory_saver that ships a CUDA {major} build: "
                f"pip install 'torch-memory-saver>=0.0.9.post1' (it ships _cu12 and _cu13 builds)")
    return (f"no torch_memory_saver release ships a CUDA {major} build (releases ship CUDA "
            f"{' and '.join(map(str, RELEASED_CUDA_MAJORS))} builds); torch_memory_saver 0.0.8's build needs only the "
            f"driver ({DRIVER_SONAME}), not a CUDA {major} runtime: pip install 'torch-memory-saver==0.0.8'")
