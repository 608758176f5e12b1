"""Why a survey found no plan, in words that name the cause first and then the fix.

Only a start that finds no plan reads this module (:func:`tms_autopreload.decision.survey` imports it
then): in the decision's module these words were a quarter of the code that every flagged start loads, and
loading code costs a start time (docs/performance.md).
"""

from .environment import CUDA_MAJOR_VAR, PATH_VAR
from .environment import MAX_ARG_STRLEN, env_string_size
from .errors import (CAUSE_ENV_TOO_LARGE, CAUSE_FORCED_DOES_NOT_FIT, CAUSE_NO_BINDING, CAUSE_NO_BUILD_FITS,
                     CAUSE_NO_DRIVER, CAUSE_UNTRUSTED_BUILDS, PATH_SHOWN, ResolveError, shown)
from .gpu_libraries import DRIVER_SONAME
from .runtime import Runtime, install_hint, split_from_torch
from .trust import TRUST_CAUSES
from .verdict import Verdict

TYPE_CHECKING = False  # typing costs milliseconds to import on the start-up path
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["no_fit", "too_big"]


def too_big(env: "Mapping[str, str]") -> ResolveError:
    """The error when the kernel refuses to exec the planned environment (E2BIG), naming its largest variables."""
    largest = sorted(env, key=lambda name: -env_string_size(name, env[name]))[:3]
    sizes = ", ".join(f"{name} ({env_string_size(name, env[name])} bytes)" for name in largest)
    return ResolveError(f"{sizes}: the environment is too large for the kernel to start any program with it (E2BIG: "
                        f"one variable over {MAX_ARG_STRLEN} bytes, or all together over the exec limit)",
                        fix="shorten or unset those variables", cause=CAUSE_ENV_TOO_LARGE)


def no_fit(runtime: Runtime, ordered: tuple[Verdict, ...], eligible: list[int], forced: str | None,
            ld_library_path: str, package_dir: str | None = None) -> ResolveError:
    """The error when no build fits: the cause first (what the user set, who else can write every build
    that fits, or the driver every build that fits the runtime misses), then every candidate with its
    reason; the fix from what the candidates' verdicts suggest."""
    refused = [v for v in ordered if v.cause in TRUST_CAUSES]  # they fit; others can write them
    fixes = [f for i in eligible if (f := ordered[i].fix)] + list(dict.fromkeys(v.fix for v in refused if v.fix))
    listing = [f"  - {v.build.name}: {v.reason}" for v in ordered]
    split, torch = split_from_torch(runtime), runtime.torch
    built = None
    if split is not None and torch is not None:
        # The override names another runtime than torch links: that, not a missing build or runtime, is the
        # cause; installing the runtime it names, or a build for it, would only split the hook from torch
        # (split_warning).
        built = f"torch at {torch.dir} " + (f"is built for CUDA {torch.cuda}" if torch.cuda else f"links {split}")
        fixes = [f"`unset {CUDA_MAJOR_VAR}` ({built})",
                 *(f for f in fixes if f != install_hint(runtime.kind, runtime.major))]
    from .reinstall import build_install_hint

    reasons_above = f"see the reasons above, or set {PATH_VAR} to a build that loads"
    if refused and not eligible:
        only = refused[0].build.refusal if len(refused) == 1 else None
        head = (f"{refused[0].build.name}, the torch_memory_saver preload build for {runtime.name}, is not preloaded: "
                f"{only.message}" if only else
                f"every torch_memory_saver preload build for {runtime.name} can be changed by someone who "
                f"cannot change this environment's code, so none is preloaded")
        return ResolveError("\n".join([head + ":", *listing]), cause=CAUSE_UNTRUSTED_BUILDS,
                            fix="; or ".join(fixes) + f"; or name the build in {PATH_VAR} to preload it anyway")
    if eligible and all(ordered[i].cause == CAUSE_NO_DRIVER for i in eligible):
        where = (f"LD_LIBRARY_PATH={shown(ld_library_path, PATH_SHOWN)}, /etc/ld.so.cache and the default directories"
                 if ld_library_path else "/etc/ld.so.cache and the default directories")
        head = (f"the NVIDIA driver library {DRIVER_SONAME} is not found by the loader (it searched {where}), "
                f"so no torch_memory_saver preload build can load for {runtime.describe()}")
        return ResolveError("\n".join([head + ":", *listing]), fix="; or ".join(dict.fromkeys(fixes)),
                            cause=CAUSE_NO_DRIVER)
    if eligible and all(ordered[i].cause == CAUSE_NO_BINDING for i in eligible):
        head = (f"no plan maps exactly one {runtime.soname} (the copy torch uses) in this interpreter and lets a "
                f"non-Python child start, for {runtime.describe()}")
        return ResolveError("\n".join([head + ":", *listing]), cause=CAUSE_NO_BINDING,
                            fix="; or ".join(dict.fromkeys(fixes)) if fixes else reasons_above)
    if forced:
        head = f"{PATH_VAR}={shown(forced, PATH_SHOWN)} names a build that does not fit {runtime.describe()}"
        return ResolveError("\n".join([head + ":", *listing]), cause=CAUSE_FORCED_DOES_NOT_FIT,
                            fix=f"`unset {CUDA_MAJOR_VAR} {PATH_VAR}` to use torch's runtime ({built})" if built
                            else f"`unset {PATH_VAR}` to choose among the installed builds (or point it at a build "
                                 f"for {runtime.name})")
    if not eligible and not built:
        fixes.append(build_install_hint(runtime.kind, runtime.major, package_dir))
    return ResolveError("\n".join([f"no torch_memory_saver preload build fits {runtime.describe()}:", *listing]),
                        fix="; or ".join(dict.fromkeys(fixes)) if fixes else reasons_above, cause=CAUSE_NO_BUILD_FITS)
