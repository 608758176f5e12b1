"""docs/troubleshooting.md: one section per error text users see, each naming the tests that back it.
Every named test must exist, so that the page cannot point at a test that was renamed or removed."""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest
from support import MAPPED, ROOT, clean_env, fenced_blocks

PAGE = ROOT / "docs" / "troubleshooting.md"
ERRORS = ("libcudart.so.12: cannot open shared object file", "libcudart.so.13: cannot open shared object file",
          "TorchMemorySaver observes invalid LD_PRELOAD", "torch.cuda.is_available()",
          "Driver/library version mismatch",
          "two runtime copies", "who cannot write this environment's code", "Exit 78 from the start-up hook",
          "tms_autopreload.pth is left over", "no node was counted", "a second CUDA runtime in every process",
          "makes the hook use libcudart.so.12 while torch")


def test_every_error_text_has_a_section_backed_by_existing_tests():
    text = PAGE.read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    for error in ERRORS:
        section = next((s for s in sections if error in s.splitlines()[0]), None)
        assert section is not None, f"no section for {error!r}"
        assert "**Test" in section and "doctor" in section and "**Fix" in section, error
    named = re.findall(r"`(tests/test_\w+\.py)::(\w+)`", text)
    assert len(named) >= len(ERRORS)
    for path, name in named:
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), flags=re.M), f"{path}::{name} does not exist"


def test_the_readme_links_it():
    assert "(docs/troubleshooting.md)" in (ROOT / "README.md").read_text()


# ---------------------------------------------------------------- the crash a user already has

CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
# Each loader crash of the page: the host that shows it, the build a launcher named by file name there, the build
# that fits. The seed's own (slime #2186: 0.0.9.post1's cu12 build on a CUDA 13 node) and its mirror (0.0.10's
# cu13 build on a pip-only CUDA 12 node).
CRASHES = {
    "libcudart.so.12": (dict(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda13")), CU12, CU13),
    "libcudart.so.13": (dict(tms="0.0.10", torch="cu12-pip", pip=(12,), host=("driver",)), CU13, CU12),
}
# The next start, judged: the torch_memory_saver builds it maps, and whether a bash child of it starts.
PROBE = MAPPED + ("import json, subprocess\n"
                  "print(json.dumps({'hooks': mapped('torch_memory_saver'),"
                  " 'bash': subprocess.run(['bash', '-c', 'true']).returncode}))\n")


def fix_blocks(error: str) -> list[str]:
    """The fixes a user pastes into the shell that shows ``error``: the ``sh`` blocks of its section, and the
    commands of the README's row for it, one a line, in the row's order."""
    section = next(s for s in re.split(r"^## ", PAGE.read_text(), flags=re.M)[1:] if error in s.splitlines()[0])
    row = next(line for line in (ROOT / "README.md").read_text().splitlines()
               if line.startswith("| `libcudart.so.12` / `.so.13`"))
    commands = [c for c in re.findall(r"`([^`]+)`", row.split("|")[3]) if c.split()[0] in ("unset", "export")]
    return [*fenced_blocks(section, "sh"), "\n".join(commands)]


@pytest.mark.parametrize("shell", ["sh", "bash"])
@pytest.mark.parametrize("error", CRASHES)
def test_the_loader_crash_is_fixed_from_the_shell_that_shows_it(scenario, error, shell):
    """Each fix of the page's loader crashes, pasted as written into the shell that shows the crash: one that
    exported the build a launcher picked by name, so that every program it starts dies in the loader (exit 127
    with the page's line), ``tms-autopreload`` and ``env`` too. After the fix the next Python start maps exactly
    the build that fits, and its ``bash`` child starts."""
    kw, wrong, right = CRASHES[error]
    scn = scenario(**kw)
    blocks = fix_blocks(error)
    assert blocks, f"the {error} section gives no fix to paste"
    for block in blocks:
        script = (f"export LD_PRELOAD={shlex.quote(str(scn.site / wrong))}\n"
                  'python -c pass 2>&1; echo "crashed with $?"\n'  # the crash the user has: the shell lives on
                  f"{block}\n"
                  'python -c "$PROBE"\n')
        r = scn.host.run([shell, "-c", script], clean_env(PATH=f"{scn.venv.python.parent}:{os.environ['PATH']}",
                                                          PROBE=PROBE))
        assert f"error while loading shared libraries: {error}: cannot open shared object file" in r.stdout, r.stdout
        assert "crashed with 127" in r.stdout, r.stdout
        assert r.returncode == 0, (block, r.stdout, r.stderr)
        got = json.loads(r.stdout.splitlines()[-1])
        assert got == {"hooks": [str(scn.site / right)], "bash": 0}, (block, got, r.stderr)


def test_where_doctor_runs_beside_a_wrong_preload_it_says_so_and_its_fix_works_pasted(scenario):
    """Where the build a launcher exported loads after all (both runtimes in the loader's cache), ``doctor`` runs
    in that shell, and says that the shell's LD_PRELOAD names another build than the one it chose; its fix,
    pasted there with the flag it names, leaves the next start with exactly the chosen build."""
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda12", "cuda13"))
    wrong = shlex.quote(str(scn.site / CU12))
    path = f"{scn.venv.python.parent}:{os.environ['PATH']}"
    r = scn.host.run(["sh", "-c", f"export LD_PRELOAD={wrong}; tms-autopreload doctor"], clean_env(PATH=path))
    assert r.returncode == 0, r.stderr
    warning = next(line for line in r.stdout.splitlines() if line.startswith("warning: this shell's LD_PRELOAD"))
    assert CU12 in warning and str(scn.site / CU13) in warning, warning
    fix = re.findall(r"`([^`]+)`", warning.partition("Fix: ")[2])
    assert fix[:2] == ["unset LD_PRELOAD", "export TMS_AUTOPRELOAD=1"], fix  # the flag named, as pasted
    for then in fix[1:]:
        script = f"export LD_PRELOAD={wrong}\n{fix[0]}\n{then}\npython -c \"$PROBE\"\n"
        r = scn.host.run(["bash", "-c", script], clean_env(PATH=path, PROBE=PROBE))
        assert r.returncode == 0, (then, r.stderr)
        assert json.loads(r.stdout.splitlines()[-1]) == {"hooks": [str(scn.site / CU13)], "bash": 0}, (then, r.stderr)
