"""Which installed distribution brings a file, and which installed distributions require it.

Read from their metadata (``RECORD``, ``Requires-Dist``), never by importing them. For ``doctor``'s advice
about a second runtime torch maps (:func:`tms_autopreload.runtime.runtime_by_path`): a fix that uninstalls a
wheel is given only where nothing installed requires that wheel and this environment's pip removes it
(:func:`tms_autopreload.installer.pip_refusal`).
"""

import os
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["owner", "required_by", "uninstall_advice"]

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normal(name: str) -> str:
    """A distribution name as the package index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def owner(path: str) -> "tuple[str, str] | None":
    """(the name of the installed distribution whose ``RECORD`` lists ``path``, the site directory it is
    installed in), or None."""
    from importlib import metadata

    real = os.path.realpath(path)
    site = os.path.dirname(real)
    for _ in range(4):  # nvidia/<folder>/lib/<file>: the site directory is three levels up
        site = os.path.dirname(site)
        rel = os.path.relpath(real, site)
        for dist in metadata.distributions(path=[site]):
            if any(os.path.normpath(str(f)) == rel for f in dist.files or ()):
                return str(dist.metadata["Name"]), site
    return None


def required_by(name: str) -> "dict[str, str]":
    """Each distribution installed for this interpreter whose ``Requires-Dist`` names ``name``, with the
    condition of that requirement (its extra or marker, as written; "" for none). Conditions are not
    evaluated: a requirement under an extra that was not installed counts too, the cautious answer."""
    from importlib import metadata

    want, out = _normal(name), {}
    for dist in metadata.distributions():
        for req in dist.requires or ():
            m = _NAME.match(req)
            if m and _normal(m.group(1)) == want:
                out[str(dist.metadata["Name"])] = req.partition(";")[2].strip()
    return dict(sorted(out.items()))


def uninstall_advice(path: str) -> "dict[str, Any]":
    """What removes ``path``: ``wheel`` (the distribution that brings it, or None), ``site`` (where that is
    installed), ``refusal`` (why this environment's pip would not remove it, or None), ``required_by``
    (those that require it, with their conditions) and ``fix`` (``pip uninstall`` only where nothing
    requires it and pip removes it, else None)."""
    from .installer import pip_command, pip_refusal

    found = owner(path)
    if found is None:
        return {"wheel": None, "site": None, "refusal": None, "required_by": {}, "fix": None}
    name, site = found
    needs, refusal = required_by(name), pip_refusal(site)
    return {"wheel": name, "site": site, "refusal": refusal, "required_by": needs,
            "fix": None if refusal or needs else pip_command("uninstall", name)}
