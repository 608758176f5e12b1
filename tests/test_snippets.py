"""What users copy from the docs, run as they would run it.

test_docs.py parses every ``tms-autopreload`` command line with the real parser; this module runs
the rest: the Python snippets of docs/reference.md (``activate()``, ``configure_subprocess()``), the
``ray job submit`` lines of docs/integrations.md (the shell expands them, ``ray`` itself stands aside
to show the argument it was given), and the ``torchrun`` line without ``--standalone`` of the README
and docs/integrations.md. Every Python block of the docs at least compiles.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
from pathlib import Path

import pytest
from support import MAPPED, REEXECD, clean_env, fenced_blocks, free_port

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
MAPS = MAPPED + ("import json, os\n"
                 "print(json.dumps({'hooks': mapped('torch_memory_saver'), 'cudart': mapped('/libcudart')}))\n")


def fences(page: Path, lang: str = "") -> list[str]:
    """The bodies of ``page``'s fenced blocks whose info string is ``lang``."""
    return fenced_blocks(page.read_text(), lang)


def snippet(page: Path, word: str) -> str:
    """The one Python block of ``page`` that contains ``word``."""
    found = [b for b in fences(page, "python") if word in b]
    assert len(found) == 1, (page.name, word, found)
    return found[0]


def shown_line(page: Path, start: str) -> list[str]:
    """Every line of ``page``'s plain fenced blocks that starts with ``start``."""
    return [line for block in fences(page) for line in block.splitlines() if line.startswith(start)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_block_of_the_docs_compiles(page):
    for block in fences(page, "python"):
        ast.parse(block)


def test_the_activate_snippet_hooks_torch_in_process(real_torch):
    """docs/reference.md's ``activate()`` snippet, as a notebook's first cell would run it, with real torch
    on a pip-only CUDA 13 node: the cu13 hook and torch's own libcudart, one copy, no exec."""
    scn = real_torch(("driver",))
    code = REEXECD + snippet(ROOT / "docs" / "reference.md", "activate()") + MAPS.replace(
        "'cudart'", "'reexecd': reexecd(), 'cudart'")
    r = scn.run(["-c", code])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["hooks"] == [os.path.realpath(scn.site / CU13)] and not got["reexecd"], got
    assert got["cudart"] == [os.path.realpath(scn.site / "nvidia/cu13/lib/libcudart.so.13")], got


def test_the_configure_subprocess_snippet_hooks_the_child_only(scenario, tmp_path):
    """docs/reference.md's ``configure_subprocess()`` snippet, with ``proc`` a spawn child (SGLang's start
    method) that copies its own /proc/self/maps: the child maps the cu13 hook, the parent none."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    child_maps = tmp_path / "child-maps"
    proc = ("import multiprocessing, shutil\n"
            f"proc = multiprocessing.get_context('spawn').Process(target=shutil.copyfile, "
            f"args=('/proc/self/maps', {str(child_maps)!r}))\n")
    code = ("if __name__ == '__main__':\n"
            + "".join(f"    {line}\n" for line in (proc + snippet(ROOT / "docs" / "reference.md",
                                                                   "configure_subprocess()")).splitlines())
            + "    proc.join()\n"
            + "".join(f"    {line}\n" for line in MAPS.splitlines()))
    script = tmp_path / "launcher.py"
    script.write_text(code)
    r = scn.run([str(script)])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["hooks"] == []
    hooks = {line.split(None, 5)[5] for line in child_maps.read_text().splitlines() if "torch_memory_saver" in line}
    assert hooks == {os.path.realpath(scn.site / CU13)}, hooks


def _ray_argv(scn, line: str) -> list[str]:
    """The arguments ``ray`` receives from ``line`` as bash expands it in ``scn``'s environment, with a
    shell function named ``ray`` in its place (no cluster: what is checked is what reaches Ray)."""
    stand_in = 'ray() { python3 -c "import json, sys; print(json.dumps(sys.argv[1:]))" "$@"; }; '
    r = scn.host.run(["bash", "-c", stand_in + line],
                     clean_env(PATH=f"{scn.venv.path / 'bin'}:{os.environ['PATH']}"))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_the_ray_job_submit_lines_send_what_they_say(scenario):
    """docs/integrations.md: the flag line sends only the flag; the resolved line sends this machine's
    plan, exactly ``tms-autopreload env --json``."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    lines = shown_line(ROOT / "docs" / "integrations.md", "ray job submit")
    assert len(lines) == 2, lines
    sent = []
    for line in lines:
        argv = _ray_argv(scn, line)
        assert argv[:2] == ["job", "submit"] and argv[-3:] == ["--", "python", "train.py"], argv
        sent.append(json.loads(argv[argv.index("--runtime-env-json") + 1]))
    assert sent[0] == {"env_vars": {"TMS_AUTOPRELOAD": "1"}}
    r = scn.run(["-m", "tms_autopreload", "env", "--json"])
    assert r.returncode == 0, r.stderr
    assert sent[1] == {"env_vars": json.loads(r.stdout)}
    assert os.path.realpath(sent[1]["env_vars"]["LD_PRELOAD"]) == os.path.realpath(scn.site / CU13)


def test_the_sglang_line_flags_the_launcher():
    """docs/integrations.md's SGLang line sets the flag for ``python -m sglang.launch_server`` itself."""
    page = (ROOT / "docs" / "integrations.md").read_text()
    line = re.search(r"`(TMS_AUTOPRELOAD=1 python -m sglang\.launch_server[^`]*)`", page).group(1)
    argv = shlex.split(line)
    assert argv[:4] == ["TMS_AUTOPRELOAD=1", "python", "-m", "sglang.launch_server"], argv


RANK = REEXECD + MAPPED + r"""
import json, os
report = {'hooks': mapped('torch_memory_saver'), 'cudart': mapped('/libcudart'),
          'reexecd': reexecd(), 'agent_hooks': mapped('torch_memory_saver', os.getppid()),
          'agent_reexecd': reexecd(os.getppid())}
with open(os.path.join(os.environ['RANK_REPORTS'], os.environ['RANK']), 'w') as f:
    json.dump(report, f)
"""


@pytest.mark.parametrize("page", ["README.md", "docs/integrations.md"])
def test_the_torchrun_line_hooks_the_agent_and_every_rank(real_torch, tmp_path, page):
    """The torchrun line as shown (no ``--standalone``: torchrun's static rendezvous on this machine; its
    port comes through ``PET_MASTER_PORT``, torchrun's own variable for ``--master-port``, so that the
    line stays as shown). ``train.py`` writes what each rank and its agent map. The agent is hooked by one
    exec; every rank inherits the plan without one. Two ranks, whatever the line's count: the machines
    that run this suite have two cores."""
    lines = shown_line(ROOT / page, "TMS_AUTOPRELOAD=1 torchrun")
    assert len(lines) == 1, lines
    argv = shlex.split(lines[0])
    assert argv[:2] == ["TMS_AUTOPRELOAD=1", "torchrun"] and argv[-1] == "train.py", argv
    assert "--standalone" not in argv and "--nproc-per-node" in argv, argv
    scn = real_torch(("driver",))
    (tmp_path / "train.py").write_text(RANK)
    reports = tmp_path / "reports"
    reports.mkdir()
    run_argv = [str(scn.venv.path / "bin" / "torchrun"), *argv[2:]]
    run_argv[run_argv.index("--nproc-per-node") + 1] = "2"
    # TMPDIR: torchrun's agent keeps its run directory (torchelastic_*) there, and leaves it
    r = scn.host.run(run_argv, clean_env(TMS_AUTOPRELOAD="1", PET_MASTER_PORT=str(free_port()),
                                         RANK_REPORTS=str(reports), TMPDIR=str(tmp_path)), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = [json.loads((reports / str(rank)).read_text()) for rank in range(2)]
    hook = os.path.realpath(scn.site / CU13)
    for d in got:
        assert d["hooks"] == d["agent_hooks"] == [hook] and d["agent_reexecd"] and not d["reexecd"], d
        assert d["cudart"] == [os.path.realpath(scn.site / "nvidia/cu13/lib/libcudart.so.13")], d


@pytest.mark.slow
def test_the_instruction_counts_run_as_performance_md_shows(tmp_path):
    """performance.md's callgrind commands: ``tools/start_cost.py --against REV`` counts a flagged first start
    in exec and dlopen mode beside REV's (here this very commit, so each pair is within a hair of equal), and
    ``tools/pth_cost.py`` the start with no flag against the floor of an ``import os`` line; both only print."""
    import subprocess
    import sys

    text = (ROOT / "docs" / "performance.md").read_text()
    assert "`python3 tools/start_cost.py --against b9a7594`" in text and "`python3 tools/pth_cost.py`" in text
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "start_cost.py"), "--dir", str(tmp_path), "--against",
                        "HEAD"], capture_output=True, text=True, timeout=900, env=clean_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = re.findall(r"^(exec|dlopen) +([\d,]+)  (.+)$", r.stdout, flags=re.M)
    assert [(mode, label.split(" ")[0]) for mode, _, label in rows] == [
        ("exec", "this"), ("exec", "HEAD"), ("dlopen", "this"), ("dlopen", "HEAD")], r.stdout
    counts = [int(n.replace(",", "")) for _, n, _ in rows]
    assert all(c > 10_000_000 for c in counts) and abs(counts[0] - counts[1]) < counts[0] // 50, r.stdout
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "pth_cost.py")], capture_output=True, text=True,
                       timeout=600, env=clean_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"tms_autopreload\.pth  \+\d\.\d{3} M over the floor$", r.stdout, flags=re.M), r.stdout


@pytest.mark.slow
def test_the_bench_against_a_revision_runs_as_performance_md_shows(tmp_path):
    """performance.md's side-by-side command: ``tools/bench.py --against REV`` exports REV with git, builds
    its wheel and venv beside this checkout's, and prints the four rows (here REV is this very commit, at a
    handful of runs: what is checked is that the command works, not a figure)."""
    import subprocess
    import sys

    assert "`python3 tools/bench.py --against REV`" in (ROOT / "docs" / "performance.md").read_text()
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench.py"), "--dir", str(tmp_path), "--against", "HEAD",
                        "--n", "4"], capture_output=True, text=True, timeout=900, env=clean_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = re.findall(r"^\| (P1|P2|P2'|P3) \| (\d+\.\d{3}) \| (\d+\.\d{3}) \|$", r.stdout, flags=re.M)
    assert [name for name, *_ in rows] == ["P1", "P2", "P2'", "P3"], r.stdout
