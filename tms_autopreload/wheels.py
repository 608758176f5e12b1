"""Which installed distribution brings a file, and which installed distributions require it: read from their
metadata (``RECORD``, ``Requires-Dist``), never by importing them. For ``doctor``'s advice about a second
runtime torch maps (:mod:`tms_autopreload.torchinit`): a fix that uninstalls a wheel is given only where
nothing installed requires that wheel.
"""

import os
import re

__all__ = ["owner", "required_by", "uninstall_advice"]

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normal(name: str) -> str:
    """A distribution name as the package index compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def owner(path: str) -> "str | None":
    """The name of the installed distribution whose ``RECORD`` lists ``path``, or None."""
    from importlib import metadata

    real = os.path.realpath(path)
    site = os.path.dirname(real)
    for _ in range(4):  # nvidia/<folder>/lib/<file>: the site directory is three levels up
        site = os.path.dirname(site)
        rel = os.path.relpath(real, site)
        for dist in metadata.distributions(path=[site]):
            if any(os.path.normpath(str(f)) == rel for f in dist.files or ()):
                return str(dist.metadata["Name"])
    return None


def required_by(name: str) -> "list[str]":
    """The name of each distribution installed for this interpreter whose ``Requires-Dist`` names ``name``,
    whatever its markers and extras (a requirement under an extra that was not installed counts too: the
    cautious answer)."""
    from importlib import metadata

    want, out = _normal(name), set()
    for dist in metadata.distributions():
        for req in dist.requires or ():
            m = _NAME.match(req)
            if m and _normal(m.group(1)) == want:
                out.add(str(dist.metadata["Name"]))
    return sorted(out)


def uninstall_advice(path: str) -> "tuple[str | None, list[str], str | None]":
    """(the distribution that brings ``path``, those that require it, the fix that removes it: ``pip
    uninstall`` only where nothing requires it, else None)."""
    name = owner(path)
    if name is None:
        return None, [], None
    needs = required_by(name)
    return name, needs, None if needs else f"pip uninstall {name}"
