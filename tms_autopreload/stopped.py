"""What a start that stops says beyond its reason: why a re-exec did not take, and the way out.

Only a stopped start reads this module (:mod:`tms_autopreload.startup` imports it then, and
:mod:`tms_autopreload.leftover`, whose functions ``tools/pthfile.py`` copies into the ``.pth`` file's
fallback): a start that finds its plan loads none of these words.
"""

import os
import sys

from .environment import DISABLE_VAR, EXEC_VAR, FLAG_VARS, NO_HOOK, split_preload, state_build

__all__ = ["not_taken", "shell_way_out", "way_out"]


def not_taken(mapped: "list[str]") -> str:
    """Why this re-executed process still lacks the hook it was re-executed for, as far as it can tell: the
    planned build mapped beside others, LD_PRELOAD kept its entry and the loader did not map it, or
    LD_PRELOAD lost it between the exec and this interpreter."""
    env = os.environ
    planned = state_build()
    preload = env.get("LD_PRELOAD", "")
    done = f"{EXEC_VAR}={env.get(EXEC_VAR)} says this process re-executed once to preload {planned or 'the hook'}"
    seen = f"torch_memory_saver builds mapped: {', '.join(mapped) or 'none'}"
    if planned and planned in mapped:
        why = (f"it is mapped, but not alone ({seen}): LD_PRELOAD={preload!r} names other builds too, which compete "
               f"for the same symbols")
    elif planned and planned in split_preload(preload):
        why = (f"it is not mapped ({seen}) although LD_PRELOAD still names it, so the loader did not preload it: "
               f"a program in secure-execution mode (setuid, or with capabilities) preloads only from the system's "
               f"library directories")
    else:
        why = (f"it is not mapped ({seen}) and LD_PRELOAD={preload!r} no longer names it: something between the "
               f"exec and this interpreter drops or rewrites LD_PRELOAD (a setuid wrapper, or a launcher that "
               f"cleans the environment)")
    return f"{done}, but {why}; not trying again. Run `tms-autopreload doctor`."


def shell_way_out() -> str:
    """How to run any command from this shell without the hook: the first line of :func:`way_out`, and all of it
    that a ``.pth`` whose start module is gone says (``tools/pthfile.py`` writes this into the file)."""
    flags = " ".join(name for name in FLAG_VARS if name in os.environ)
    return (f"To run a command here without the hook: `{NO_HOOK} COMMAND` (every printed fix starts so), or "
            f"`unset {flags}` (or export {DISABLE_VAR}=1) for the rest of this shell.")


def way_out() -> str:
    """What a stopped process's message ends with: how to run any command from this shell without the hook,
    and, where the message is read off the node (a Ray worker's or a Slurm step's log), where to run it."""
    lines = [shell_way_out()]
    node = os.uname().nodename
    if os.path.basename(sys.argv[0] if sys.argv else "") == "default_worker.py":
        lines.append(f"This process is a Ray worker on node {node}: run the fix there, for {sys.executable} (the "
                     f"environment Ray starts that node's workers from); `tms-autopreload doctor --ray` checks every "
                     f"node.")
    elif os.environ.get("SLURM_JOB_ID"):
        node = os.environ.get("SLURMD_NODENAME") or node
        lines.append(f"This process is a step of Slurm job {os.environ['SLURM_JOB_ID']} on node {node}: run the fix "
                     f"there, for {sys.executable} (for example `srun --jobid {os.environ['SLURM_JOB_ID']} -w {node} "
                     f"--overlap COMMAND`).")
    return "\n".join(lines)
