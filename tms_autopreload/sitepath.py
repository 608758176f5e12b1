"""The module search path this interpreter will have once site.py is done, asked while it is not.

The start-up hook runs from a ``.pth`` import line, and site.py executes an import line while it
is still adding site directories. On CPython 3.10-3.14 it adds, in this order (``site.main``):
the venv's site-packages, the user site (``~/.local/lib/pythonX.Y/site-packages``), then the
site-packages of ``site.PREFIXES`` (a venv's base interpreter's too, under
``--system-site-packages``), each directory followed by the path lines of its ``.pth`` files in
sorted order. An import line sees only what came before it: from a venv, the user site and the
base's packages are not on ``sys.path`` yet, nor is a directory that ``zz_torch.pth`` (sorting after
``tms_autopreload.pth``) names. :func:`search_path` adds what site.py will still add, with site.py's
own functions where it has them (a distribution's patched ``getsitepackages``, Debian's
``dist-packages``, included) and its rules where it has none.

From 3.15 site.py adds the path lines of every site directory before it runs any import line (PEP
829's batching); tests/test_sitepath.py shows it with Debian's 3.15, so there ``sys.path`` is taken as
it is. What no version can tell beforehand: the directories that later import lines, ``.start``
entry points, ``sitecustomize`` or ``usercustomize`` add, and ``sys.path[0]`` (the script's
directory), which the interpreter inserts after site.py.

On that path, packages are found without importing them (:func:`package_dir`, :func:`pip_runtime_libcudart`):
``import torch`` costs seconds and ``import torch_memory_saver`` imports torch; even
``importlib.util.find_spec`` costs milliseconds to import. The import system's own finders (``sys.meta_path``:
the path finder, and the finders editable installs add) answer "where would this top-level package come from"
without running it, and are already loaded.
"""

import os
import sys

from .environment import read_regular
from .gpu_libraries import CUDA, runtime_soname, wheel_lib_dirs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["search_path", "site_dirs", "add_site_dir", "pth_paths", "system_site", "package_dir",
           "pip_runtime_libcudart"]

# From 3.15 every .pth path line is on sys.path before any import line runs.
_BATCHED = (3, 15)
_LIMIT = 1 << 20  # a .pth or pyvenv.cfg larger than this is not read further


_computed: "dict[tuple[str, ...], list[str]]" = {}  # sys.path as it was -> what search_path() gave


def search_path() -> "list[str]":
    """``sys.path`` as site.py will leave it: the current entries, then each site directory and
    each ``.pth`` path line that site.py has still to add, in its order.

    Computed once per value of ``sys.path``: one survey asks it for torch, torch_memory_saver and
    the runtime wheels, and reading the site directories again would cost each start that much more."""
    key = tuple(sys.path)
    if key not in _computed:
        _computed[key] = _search_path()
    return list(_computed[key])


def _search_path() -> "list[str]":
    path = list(sys.path)
    site = sys.modules.get("site")
    if site is None or sys.flags.no_site or sys.version_info >= _BATCHED:
        return path
    known = {os.path.normcase(_absolute(p)) for p in path}
    # gh-113659 (3.13, and its backports to 3.8-3.12 of early 2024) skips .pth files named with a leading
    # dot; its hidden-file check is why such a site.py imports ``stat``.
    skip_dotted = hasattr(site, "stat")
    # A directory site.py processes again (a venv's site-packages, as the venv's and as its prefix's) adds
    # nothing to this model the first time did not (it runs no import line, and every path line it could add is
    # known by then), so it is read once.
    for sitedir in dict.fromkeys(site_dirs(site)):
        if os.path.isdir(sitedir):
            add_site_dir(sitedir, path, known, skip_dotted)
    return path


def site_dirs(site: "ModuleType") -> "list[str]":
    """Every site directory the running ``site`` module's ``main`` processes, in its order (the same
    directory may repeat)."""
    conf = _pyvenv_cfg()
    try:
        include = None if conf is None else system_site(_read(conf))
    except OSError:
        include = None  # site.py could not have read it either
    prefixes = [sys.prefix, sys.exec_prefix]
    dirs: "list[str]" = []
    if include is not None:  # site.venv(): the venv's own site-packages come first
        dirs += site.getsitepackages([sys.prefix])
        if include:
            prefixes += [sys.base_prefix, sys.base_exec_prefix]
    if include is not False:
        enabled = site.ENABLE_USER_SITE
        if enabled is None:
            enabled = site.check_enableusersite()
        user = site.getusersitepackages()
        if enabled and user:
            dirs.append(user)
    dirs += site.getsitepackages(prefixes)
    return dirs


def _pyvenv_cfg() -> "str | None":
    """The ``pyvenv.cfg`` site.py reads: beside the executable, or one directory up."""
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    for conf in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(os.path.dirname(exe_dir), "pyvenv.cfg")):
        if os.path.isfile(conf):
            return conf
    return None


def system_site(data: bytes) -> bool:
    """``include-system-site-packages`` of a ``pyvenv.cfg``, as site.py reads it (true unless it says
    otherwise; the last such line counts)."""
    include = "true"
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "include-system-site-packages":
            include = value.strip().lower()
    return include == "true"


def pth_paths(data: bytes) -> "list[str]":
    """The path lines of a ``.pth`` file's bytes, as site.py reads them, up to an import line that does
    not compile. Import lines are left out (nothing can tell what running one adds), but site.py
    (3.10-3.14, ``addpackage``) ``exec``s each, and on any exception ignores the rest of the file
    ("Remainder of file ignored"): a line that does not compile raises there whatever it names, so the
    path lines after it are never added. (One that compiles may still raise, an ImportError; that cannot
    be told without running it, and is taken to run.) From 3.15 site.py defers import lines and goes on
    past one that fails (PEP 829), but there :func:`search_path` takes ``sys.path`` as it is and reads
    no ``.pth`` file."""
    # 3.13 reads a .pth file as UTF-8 first (then the locale's encoding); before, in the locale's encoding.
    # A literal, not a constant: type checkers narrow on literals only (locale.getencoding is 3.11+).
    if sys.version_info >= (3, 13):
        try:
            lines = data.decode("utf-8-sig").splitlines()
        except UnicodeDecodeError:
            import locale

            lines = data.decode(locale.getencoding()).splitlines()
    else:
        import io

        lines = list(io.TextIOWrapper(io.BytesIO(data), encoding="locale"))
    paths: "list[str]" = []
    imports: "list[str]" = []  # compiled only once a path line follows them: a file's first compile()
    for line in lines:  # builds the compiler's AST types, millions of instructions a flagged start skips
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith(("import ", "import\t")):
            imports.append(line)
            continue
        if not all(map(_compiles, imports)):
            break
        imports.clear()
        paths.append(line.rstrip())
    return paths


def _compiles(line: str) -> bool:
    """Whether site.py's ``exec(line)`` gets past compiling it: a SyntaxError, or before 3.12 a
    ValueError for a NUL byte, stops it first. Compiled as ``exec`` compiles it in site.py, which has
    no ``__future__`` import."""
    try:
        compile(line, "<pth>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def add_site_dir(sitedir: str, path: "list[str]", known: "set[str]", skip_dotted: bool) -> None:
    """site.addsitedir, running nothing: append to ``path`` the directory, then its ``.pth`` files'
    existing path lines, each unless ``known`` (case-normalised absolute paths) holds it already."""
    _append(_absolute(sitedir), path, known)
    try:
        names = os.listdir(sitedir)
    except OSError:
        return
    for name in sorted(n for n in names if n.endswith(".pth") and not (skip_dotted and n.startswith("."))):
        try:
            data = _read(os.path.join(sitedir, name))
            lines = pth_paths(data)
        except (OSError, UnicodeDecodeError, LookupError):
            continue  # site.py skips a file it cannot open; one it cannot decode stops its start
        for line in lines:
            entry = _absolute(os.path.join(sitedir, line))
            if os.path.normcase(entry) not in known and os.path.exists(entry):
                _append(entry, path, known)


def _append(entry: str, path: "list[str]", known: "set[str]") -> None:
    case = os.path.normcase(entry)
    if case not in known:
        path.append(entry)
        known.add(case)


def _absolute(entry: str) -> str:
    """site.makepath: the absolute path, or the path itself when the working directory is gone."""
    try:
        return os.path.abspath(entry)
    except OSError:
        return entry


def _read(path: str) -> bytes:
    """A small configuration file's bytes (regular files only: a FIFO would block the start)."""
    return read_regular(path, _LIMIT)


def package_dir(name: str) -> "str | None":
    """Directory of top-level package ``name`` as ``import name`` would find it once site.py is done,
    or None. The path finder searches :func:`search_path`; other finders (an editable install's)
    answer as they would for ``import name``."""
    path = search_path()
    # The path finder importlib.machinery names; importing that module costs the importlib package.
    path_finder = getattr(sys.modules.get("_frozen_importlib_external"), "PathFinder", None)
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(name, path if finder is path_finder else None)
        except Exception:  # noqa: BLE001 - a third-party finder's fault must not break start-up
            continue
        if spec is None:
            continue
        locations = list(spec.submodule_search_locations or ())
        return locations[0] if locations else None
    return None


def pip_runtime_libcudart(major: int) -> "str | None":
    """Path of ``libcudart.so.<major>`` from NVIDIA's pip wheels on :func:`search_path`, or None."""
    name = runtime_soname(CUDA, major)
    for entry in search_path():
        for folder in wheel_lib_dirs(major):
            candidate = os.path.join(entry or ".", folder, name)
            if os.path.isfile(candidate):
                return os.path.abspath(candidate)
    return None
