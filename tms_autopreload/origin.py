"""How to install tms_autopreload again: from where pip says this copy came from (PEP 610).

tms-autopreload is not on the package index, so installing it by name fails, and would install whoever
registers the name. pip records a direct install's source in the distribution's
``direct_url.json`` (PEP 610): a local directory (a checkout, maybe editable), an archive or wheel (a
file or a URL), or a VCS URL at a commit. That record gives the command that installs the same thing;
without one (an index, another installer, or a deleted record) nothing is known, and the advice says so.
:func:`install_advice` is the one place that decides it; every message that tells a user to install the
package asks it (today, `doctor --ray`'s row for a node without it).
"""

import json
import shlex
from importlib import metadata
from urllib.parse import unquote, urlsplit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["install_command", "install_advice", "command_from", "record_of", "UNKNOWN_SOURCE"]

DISTRIBUTION = "tms-autopreload"
# Where no record says the source: a missing record proves nothing (an index, another installer).
UNKNOWN_SOURCE = ("the way you installed it on this machine: from its wheel or checkout (`pip install "
                  "/path/to/tms_autopreload-<version>-py3-none-any.whl` or `pip install /path/to/checkout`; "
                  "tms-autopreload is not on the package index)")


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


def command_from(record: "dict[str, Any]", *, force: bool = False) -> "str | None":
    """The ``pip install`` command that installs what ``record`` (a PEP 610 document) names (``force``: again,
    over the same version); None when the record is of no kind PEP 610 defines."""
    pip = "pip install --force-reinstall" if force else "pip install"
    url = record["url"]
    vcs = record.get("vcs_info")
    if isinstance(vcs, dict) and isinstance(vcs.get("vcs"), str):
        spec = f"{vcs['vcs']}+{url}"
        revision = vcs.get("commit_id") or vcs.get("requested_revision")
        if isinstance(revision, str) and revision:
            spec += f"@{revision}"
        if isinstance(record.get("subdirectory"), str):
            spec += f"#subdirectory={record['subdirectory']}"
        return f"{pip} {shlex.quote(spec)}"
    if isinstance(record.get("dir_info"), dict):
        editable = "-e " if record["dir_info"].get("editable") else ""
        path = _location(url)
        if isinstance(record.get("subdirectory"), str):
            path = f"{path.rstrip('/')}/{record['subdirectory']}"
        return f"{pip} {editable}{shlex.quote(path)}"
    if isinstance(record.get("archive_info"), dict):
        return f"{pip} {shlex.quote(_location(url))}"
    return None


def install_command() -> "str | None":
    """The command that installs this copy's source again, from its PEP 610 record; None without one."""
    record = _record()
    return command_from(record) if record is not None else None


def install_advice(into: str) -> str:
    """How to install tms-autopreload ``into`` another environment (in words: a node's, for ``doctor
    --ray``), with the command where pip recorded this copy's source. The record is this machine's: its
    path, or a URL that node may not reach, may not exist there, so it is offered as such."""
    command = install_command()
    if command is None:
        return f"install it into {into} {UNKNOWN_SOURCE}"
    return (f"install it into {into} from the wheel or checkout you installed it from: this machine's copy came "
            f"from `{command}`, a source that may not exist on that node (copy it there first)")
