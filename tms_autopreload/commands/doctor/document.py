"""``doctor``'s document (``doctor --json``) and its text rendering, for one process.

:func:`document` is the one place the document's schema is written (docs/reference.md lists its keys).
The survey (:func:`tms_autopreload.decision.survey`) decides the plan; this adds what only a reader needs:
what each candidate interposes and the NVIDIA driver facts (:mod:`tms_autopreload.commands.doctor.driver`), which
judge the node, not the plan, so the start-up hook never reads them. ``doctor``, the Ray preflight's
workers and the per-node table (:mod:`tms_autopreload.commands.doctor.nodes`) all read this one document.
"""

import os
import sys

from ...errors import Error
from ...gpu_libraries import CUDA
from .driver import FAILING
from ...verdict import CHOSEN
from ...decision import Report

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

__all__ = ["document", "text", "table", "is_ok", "driver_facts", "runtime_rule", "versions", "second_runtime",
           "warning_of_second", "VERSIONED"]

# The distributions whose versions a document carries (the per-node table compares them across nodes).
VERSIONED = ("tms_autopreload", "torch_memory_saver")


def table(rows: "Sequence[tuple[str, ...]]") -> str:
    """Columns padded to their widest cell; the last column is left as it is."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows)


def is_ok(plan: object, driver: object, runtime: object = None) -> bool:
    """The one rule of ``ok``, for this process's document and for a node's row (:mod:`.node_table`):
    there is a plan, the NVIDIA driver can run torch's CUDA (its verdict is not ``failing``; without driver
    facts, nothing says it cannot), and the hook uses the runtime torch links (no override split them:
    ``runtime.split``; asked for or not, the hook then does not manage torch's memory as meant). Read
    defensively: a row passes a document another node wrote."""
    return (bool(plan) and not (isinstance(driver, dict) and driver.get("verdict") == FAILING)
            and not (isinstance(runtime, dict) and runtime.get("split")))


def _split(report: Report, environ: "Mapping[str, str]") -> "dict[str, Any] | None":
    """``runtime.split``: the runtime torch links where an override makes the chosen hook use another."""
    from ...errors import CAUSE_SPLIT_RUNTIME
    from ...decision import split_fix, split_overrides, split_warning
    from ...runtime import split_from_torch

    build = report.chosen
    rt = report.runtime
    if rt is None or build is None or split_warning(rt, build, environ) is None:
        return None
    return {"torch_library": split_from_torch(rt), "overrides": split_overrides(environ),
            "cause": CAUSE_SPLIT_RUNTIME, "fix": split_fix(environ)}


def second_runtime(path: str, shared: "str | None") -> "dict[str, Any]":
    """``runtime.second``: a second runtime file torch loads by path besides ``shared`` (the copy the hook and
    torch share), the distribution that brings it and the fix; said as a warning by :func:`warning_of_second`.
    ``doctor --deep`` gives the same for a copy it sees mapped that nothing binds to."""
    from ...errors import CAUSE_IDLE_RUNTIME
    from ...wheels import uninstall_advice

    advice = uninstall_advice(path)
    needs: "dict[str, str]" = advice["required_by"]
    return {"path": path, "shared": shared, "wheel": advice["wheel"], "site": advice["site"],
            "pip_refuses": advice["refusal"], "required_by": list(needs),
            "conditions": {name: when for name, when in needs.items() if when}, "cause": CAUSE_IDLE_RUNTIME,
            "fix": advice["fix"]}


def warning_of_second(second: "dict[str, Any]") -> str:
    """What a second runtime copy means, whence it comes, and the fix where there is one (:func:`second_runtime`)."""
    whence = (f"it comes with {second['wheel']}" if second["wheel"] else
              "no installed distribution records it")
    needs, conditions = second["required_by"], second["conditions"]
    always = [n for n in needs if n not in conditions]
    if second["fix"]:
        then = f"nothing installed requires {second['wheel']}: {second['fix']} removes it"
    elif always:
        then = f"it stays while {', '.join(always)} require{'s' if len(always) == 1 else ''} it"
    elif needs:
        then = (f"{', '.join(f'{n} requires it if `{c}`' for n, c in conditions.items())}, a condition this tool "
                f"does not evaluate: remove it only if that does not hold here")
    elif second["pip_refuses"]:
        then = (f"it lies in {second['site']}, {second['pip_refuses']}, where this environment's pip removes "
                f"nothing: remove it from there if nothing needs it")
    else:
        then = "remove it if nothing needs it"
    shared = f" (the hook and torch share {second['shared']})" if second.get("shared") else ""
    return (f"torch loads {second['path']} by path once imported (torch/__init__.py's _preload_cuda_deps, "
            f"RTLD_LOCAL): a second CUDA runtime in every process that imports torch, which nothing binds to"
            f"{shared}, so the hook is not affected; {whence}, and {then}")


def _interposes(report: Report) -> "dict[str, list[str] | None]":
    """Per candidate path: what it defines that the process's runtime library defines (None: unknown)."""
    from ...builds import interposed
    from ...elf import ElfError

    library = report.runtime.library if report.runtime else None
    out: "dict[str, list[str] | None]" = {}
    for v in report.verdicts:
        try:
            out[v.build.path] = list(interposed(v.build.path, library)) if library and v.build.info else None
        except ElfError:
            out[v.build.path] = None
    return out


def driver_facts(report: Report) -> "dict[str, Any] | None":
    """The driver facts of the surveyed process, from the survey's own loader model (None when its
    interpreter could not be read), judged with why it has no plan (a missing driver library may be why)."""
    from .driver import MODULE_VERSION_FILE, examine

    rt = report.runtime
    if report.loader is None:
        return None
    return examine(report.loader, rt.major if rt is not None and rt.kind == CUDA else None, MODULE_VERSION_FILE,
                   report.failure).to_dict()


def runtime_rule(report: Report) -> "str | None":
    """The search rule (ld.so(8)'s: ``DT_RUNPATH``, ``LD_LIBRARY_PATH``, ...) by which the chosen build's
    runtime library is found once the plan's variables are set, as the survey's loader model predicts it;
    None when there is no plan, no runtime library, or the interpreter cannot be read. A build with its own
    DT_RUNPATH (torch_memory_saver #108) may need no binding; this says which rule did the finding."""
    from ...ldso import Object

    plan, rt, loader = report.plan, report.runtime, report.loader
    build = report.chosen
    if plan is None or rt is None or rt.library is None or build is None or build.info is None or loader is None \
            or rt.soname not in build.needs:  # a driver-only build (0.0.8) links no runtime library
        return None
    found = loader.under(plan.ld_library_path, plan.ld_preload).find(rt.soname, Object(build.path, build.info))
    return found.rule if found is not None else None


def versions() -> "dict[str, str | None]":
    """This interpreter's installed versions of :data:`VERSIONED` (None: not installed)."""
    from importlib import metadata

    out: "dict[str, str | None]" = {}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def document(report: Report, environ: "Mapping[str, str] | None" = None) -> "dict[str, Any]":
    """The ``doctor --json`` document: which node and Python said it (``doctor --nodes`` reads many nodes'
    documents together) with their versions, the survey, what each candidate interposes, and the driver.
    ``ok`` is false when there is no plan or the driver cannot run this torch; ``error`` is why there is
    no plan as a person reads it, ``cause`` and ``fix`` its parts for code."""
    rt, plan, failure, chosen = report.runtime, report.plan, report.failure, report.chosen
    interposes = _interposes(report)
    driver = driver_facts(report)
    env = os.environ if environ is None else environ
    split = _split(report, env)
    second = None if rt is None or rt.second is None else second_runtime(rt.second, rt.library)
    start_up = _start_up()
    runtime = None if rt is None else {
        "kind": rt.kind, "major": rt.major, "source": rt.source, "library": rt.library,
        "library_rule": rt.library_rule, "library_why": rt.library_why,
        "torch_dir": rt.torch.dir if rt.torch else None, "torch_version": rt.torch.version if rt.torch else None,
        "second": second, "split": split,
    }
    return {
        "hostname": os.uname().nodename,
        "python": sys.version.split()[0],
        "versions": versions(),
        "ok": is_ok(plan, driver, runtime) and start_up is None,
        "executable": report.executable,
        "torch_memory_saver_dir": report.package_dir,
        "runtime": runtime,
        "candidates": [{
            "path": v.build.path, "target": v.build.target(), "kind": v.build.kind, "major": v.build.major,
            "needs": list(v.build.needs), "loads": v.loader_ok, "status": v.status, "reason": v.reason,
            "cause": v.cause, "interposes": interposes.get(v.build.path),
        } for v in report.verdicts],
        "plan": None if plan is None or chosen is None else {
            "build": plan.build, "file": chosen.file, "env": plan.changes(), "binding": plan.binding,
            "runtime_rule": runtime_rule(report),
        },
        "warnings": list(report.warnings + (plan.warnings if plan else ())) + ([warning_of_second(second)]
                                                                              if second else []),
        "error": report.error,
        "cause": None if failure is None else failure.cause,
        "fix": None if failure is None else failure.fix,
        "driver": driver,
        "start_up": start_up,
    }


def _start_up() -> "dict[str, Any] | None":
    """``start_up``: why flagged starts of this interpreter are not hooked although this package is installed
    (its start-up files), with the fix a flagged start gives (:func:`tms_autopreload.leftover.not_started`)."""
    from ...leftover import not_started

    gap = not_started()
    return None if gap is None else {"cause": gap.cause, "message": gap.message, "fix": gap.fix}


def _runtime_lines(doc: "dict[str, Any]") -> "list[str]":
    from ...gpu_libraries import runtime_name, runtime_soname

    rt = doc["runtime"]
    if rt is None:
        return ["runtime:  not decided"]
    lib = f"{rt['library']} ({rt['library_rule']})" if rt["library"] else "not found"
    lines = [f"runtime:  {runtime_name(rt['kind'], rt['major'])} ({rt['source']})",
             f"library:  {runtime_soname(rt['kind'], rt['major'])} -> {lib}"]
    if rt["library"] and rt["library_why"]:
        whose = ("no torch here: the copy the hook's build will bind," if rt["torch_dir"] is None else
                 "the copy the hook will use, not torch's:" if rt.get("split") else "the copy torch will use:")
        lines.append(f"why:      {whose} {rt['library_why']}")
    plan = doc["plan"]
    if plan is not None and plan.get("binding"):
        lines.append(f"binding:  {plan['binding']}")
    return lines


def driver_lines(driver: "dict[str, Any] | None") -> "list[str]":
    """The kernel module, the bound libcuda and the verdict, one line each."""
    if driver is None:
        return ["driver:   unknown (this interpreter could not be read)"]
    module = (f"NVIDIA kernel module {driver['module_version']} ({driver['module_source']})"
              if driver["module_version"] else f"unknown: {driver['module_source']}")
    if driver["library"]:
        version = driver["library_version"] or "no version in its file name"
        runs = f", runs CUDA {driver['newest_major']}.x at most" if driver["newest_major"] else ""
        library = f"{driver['library']} ({version}, via {driver['library_rule']}{runs})"
    else:
        library = "not found"
    verdict = driver["verdict"].upper().replace("-", " ")
    line = f"driver:   {verdict}: {Error(driver['message'], fix=driver['fix'] or None)}"
    return [f"module:   {module}", f"libcuda:  {library}", line]


def chosen_build(doc: "dict[str, Any]", found: bool = False, name: "Callable[[str], str] | None" = None) -> str:
    """A document's chosen build as a reader is shown it (:func:`tms_autopreload.builds.shown_build`), with the
    search rule that finds its runtime where ``found``; ``name`` shortens each path (a node's row shows file
    names). Read defensively: a row reads a document another node wrote, perhaps an older one without
    ``plan.file``."""
    from ...builds import shown_build

    plan = doc["plan"]
    candidates = doc.get("candidates")
    chosen = next((c for c in candidates if isinstance(c, dict) and c.get("status") == CHOSEN), {}) \
        if isinstance(candidates, list) else {}
    build, file = plan["build"], plan.get("file")
    file = file if isinstance(file, str) and file else build
    kind, major = chosen.get("kind"), chosen.get("major")
    short = name or (lambda path: path)
    return shown_build(short(build), short(file), kind if isinstance(kind, str) else "",
                       major if isinstance(major, int) and not isinstance(major, bool) else None,
                       plan.get("runtime_rule") if found else None)


def text(doc: "dict[str, Any]") -> str:
    """``doctor``'s text: interpreter, runtime, driver, the candidate table, then the plan or why none."""
    out = [f"python:   {doc['executable']}",
           f"package:  {doc['torch_memory_saver_dir'] or 'torch_memory_saver not found'}",
           *_runtime_lines(doc), *driver_lines(doc.get("driver")), ""]
    if doc["candidates"]:
        rows = [("candidate", "built for", "interposes", "loads?", "verdict", "why")]
        for c in doc["candidates"]:
            loads = {True: "yes", False: "NO", None: "-"}[c["loads"]]
            interposes = "unknown" if c["interposes"] is None else ", ".join(c["interposes"]) or "none"
            rows.append((os.path.basename(c["path"]), c["target"], interposes, loads, c["status"].upper(), c["reason"]))
        out += [table(rows), ""]
    out += [f"warning: {w}" for w in doc["warnings"]]
    if doc["plan"] is not None:
        out.append(f"chosen:   {chosen_build(doc, found=True)}")
        out += [f"set:      {k}={v}" for k, v in doc["plan"]["env"].items()]
    else:
        out.append(f"NO PLAN:  {doc['error']}")
    start_up = doc.get("start_up")
    if start_up:
        out.append(f"START-UP: {Error(start_up['message'], fix=start_up['fix'])}")
    return "\n".join(out)
