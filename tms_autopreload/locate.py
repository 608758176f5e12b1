"""Find installed packages and NVIDIA runtime wheels on the search path without importing them.

``import torch`` costs seconds and ``import torch_memory_saver`` imports torch; even
``importlib.util.find_spec`` costs milliseconds to import. The import system's own finders
(``sys.meta_path``: the path finder, and the finders editable installs add) answer "where
would this top-level package come from" without running it, and are already loaded.

The path searched is :func:`tms_autopreload.sitepath.search_path`, the one site.py will leave, not
``sys.path`` as it is when the start-up hook runs (site.py has not added every directory yet).
"""

import os
import sys

from .sitepath import search_path
from .sonames import runtime_soname

__all__ = ["package_dir", "pip_runtime_libcudart", "PIP_RUNTIME_DIRS"]

# NVIDIA's runtime wheels: nvidia-cuda-runtime (13+) -> nvidia/cu<major>/lib,
# nvidia-cuda-runtime-cu12 (and cu11) -> nvidia/cuda_runtime/lib.
PIP_RUNTIME_DIRS = ("nvidia/cu{major}/lib", "nvidia/cuda_runtime/lib")


def package_dir(name: str) -> str | None:
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


def pip_runtime_libcudart(major: int) -> str | None:
    """Path of ``libcudart.so.<major>`` from NVIDIA's pip wheels on :func:`search_path`, or None."""
    name = runtime_soname("cuda", major)
    for entry in search_path():
        for pattern in PIP_RUNTIME_DIRS:
            candidate = os.path.join(entry or ".", pattern.format(major=major), name)
            if os.path.isfile(candidate):
                return os.path.abspath(candidate)
    return None
