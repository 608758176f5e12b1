"""Choose torch_memory_saver's LD_PRELOAD build for the CUDA runtime this process really uses.

The public API is loaded lazily (PEP 562): this package is imported during interpreter
start-up by ``tms_autopreload.pth``, and must cost nothing there until a flag is set.
"""

__version__ = "0.1.0"
__all__ = ["resolve", "survey", "Plan", "Report", "Verdict", "ResolveError", "__version__"]


def __getattr__(name: str):  # noqa: ANN202 - PEP 562 module attribute hook
    if name == "ResolveError":
        from .errors import ResolveError

        return ResolveError
    if name in ("resolve", "survey", "Plan", "Report", "Verdict"):
        from . import plan

        return getattr(plan, name)
    raise AttributeError(f"module 'tms_autopreload' has no attribute {name!r}")
