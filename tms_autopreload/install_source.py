"""Where pip says an installed copy came from (PEP 610), and the ``pip install`` arguments that install it again.

For this package (not on the package index: a node without it is told this machine's source) and for
torch_memory_saver (a build of one's own, reinstalled from where it was built).

tms-autopreload is not on the package index, so installing it by name fails, and would install whoever
registers the name. pip records a direct install's source in the distribution's
``direct_url.json`` (PEP 610): a local directory (a checkout, maybe editable), an archive or wheel (a
file or a URL), or a VCS URL at a commit. That record gives the command that installs the same thing;
without one (an index, another installer, or a deleted record) nothing is known, and the advice says so.
:func:`install_advice` is the one place that decides it; every message that tells a user to install the
package asks it (today, `doctor --ray`'s row for a node without it).
"""

import json
import os
from importlib import metadata
from urllib.parse import unquote, urlsplit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["install_args", "install_advice", "source_args", "local_path", "record_of", "source_gone",
           "unknown_source",
           "WHEEL_TEMPLATE"]

DISTRIBUTION = "tms-autopreload"
# Where no record says the source: a missing record proves nothing (an index, another installer).
WHEEL_TEMPLATE = "/path/to/tms_autopreload-<version>-py3-none-any.whl"


def unknown_source(python: str) -> str:
    """The advice where no record says the source: a missing record proves nothing (an index, another
    installer); the command with the wheel's path to fill in, for the environment of ``python``."""
    from .environment import NO_HOOK

    return (f"the way you installed it on this machine, from its wheel or checkout (`{NO_HOOK} {python} -m pip "
            f"install --force-reinstall {WHEEL_TEMPLATE}`, with the path of that file; tms-autopreload is not on the "
            f"package index)")


def record_of(dist: "metadata.Distribution") -> "dict[str, Any] | None":
    """The ``direct_url.json`` of an installed distribution, or None where there is none or it cannot be read."""
    try:
        text = dist.read_text("direct_url.json")
        record = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("url"), str) else None


def _record() -> "dict[str, Any] | None":
    """This installation's ``direct_url.json``, or None where there is none or it cannot be read."""
    try:
        return record_of(metadata.distribution(DISTRIBUTION))
    except metadata.PackageNotFoundError:
        return None


def _location(url: str) -> str:
    """A ``file:`` URL as the path pip takes; any other URL as it is."""
    parts = urlsplit(url)
    return unquote(parts.path) if parts.scheme == "file" and parts.netloc in ("", "localhost") else url


def local_path(record: "dict[str, Any]") -> "str | None":
    """The local file or directory ``record`` (a PEP 610 document) names, or None for a URL of another kind."""
    url = record["url"]
    return _location(url) if urlsplit(url).scheme == "file" and not record.get("vcs_info") else None


def source_gone(record: "dict[str, Any]") -> bool:
    """Whether the local file or directory ``record`` names is no longer there (a cleaned download, a moved
    checkout); a URL of another kind is not looked at."""
    path = local_path(record)
    return path is not None and not os.path.exists(path)


def source_args(record: "dict[str, Any]") -> "list[str] | None":
    """The arguments of ``pip install`` that install what ``record`` (a PEP 610 document) names (``-e``
    before an editable checkout); None when the record is of no kind PEP 610 defines."""
    url = record["url"]
    vcs = record.get("vcs_info")
    if isinstance(vcs, dict) and isinstance(vcs.get("vcs"), str):
        spec = f"{vcs['vcs']}+{url}"
        revision = vcs.get("commit_id") or vcs.get("requested_revision")
        if isinstance(revision, str) and revision:
            spec += f"@{revision}"
        if isinstance(record.get("subdirectory"), str):
            spec += f"#subdirectory={record['subdirectory']}"
        return [spec]
    if isinstance(record.get("dir_info"), dict):
        path = _location(url)
        if isinstance(record.get("subdirectory"), str):
            path = f"{path.rstrip('/')}/{record['subdirectory']}"
        return ["-e", path] if record["dir_info"].get("editable") else [path]
    if isinstance(record.get("archive_info"), dict):
        return [_location(url)]
    return None


def install_args() -> "list[str] | None":
    """The arguments of ``pip install`` that install this copy's source again, from its PEP 610 record;
    None without one."""
    record = _record()
    return source_args(record) if record is not None else None


def install_advice(into: str, python: str) -> str:
    """How to install tms-autopreload ``into`` another environment (in words: a node's, for ``doctor
    --ray``, whose interpreter is ``python``), with the command where pip recorded this copy's source. The
    record is this machine's: its path, or a URL that node may not reach, may not exist there, so it is
    offered as such."""
    from .installer import pip_command

    args = install_args()
    if args is None:
        return f"install it into {into} {unknown_source(python)}"
    return (f"install it into {into} from the wheel or checkout you installed it from: this machine's copy came "
            f"from {pip_command('install', *args, python=python)} (run it on that node), a source that may not "
            f"exist on that node (copy it there first)")
