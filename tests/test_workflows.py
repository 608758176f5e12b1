"""The GitHub workflows (.github/workflows): what they run is the Makefile's own targets, and `make lint`
checks them against GitHub's workflow schema and with zizmor. They cannot run here; this is what can be
checked of them here."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
BIN = Path(sys.executable).parent
# An action pinned by commit, with the release it is as a comment: `uses: owner/name@<40 hex> # v1.2.3`.
PINNED = re.compile(r"uses: [\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+)*")


def _targets() -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M)}


def _make_calls(workflow: Path) -> list[list[str]]:
    """Each ``make`` command of the workflow's ``run:`` steps, split as the shell splits it."""
    calls = []
    for line in workflow.read_text().splitlines():
        command = line.strip().removeprefix("run:").strip()
        if command.startswith("make "):
            calls.append(shlex.split(command))
    return calls


@pytest.mark.parametrize("name", ["ci.yml", "release.yml", "mutants.yml"])
def test_the_workflows_run_the_makefiles_targets(name):
    calls = _make_calls(WORKFLOWS / name)
    assert calls
    for call in calls:
        targets = [word for word in call[1:] if "=" not in word]
        assert targets and set(targets) <= _targets(), call


def test_ci_runs_lint_and_the_fast_lane_on_every_python_from_the_floor_and_the_whole_suite():
    text = (WORKFLOWS / "ci.yml").read_text()
    (matrix,) = re.findall(r"^ +python: \[(.*)\]$", text, re.M)
    versions = [v.strip(' "') for v in matrix.split(",")]
    (floor,) = re.findall(r'^requires-python = ">=([\d.]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert versions == [f"3.{minor}" for minor in range(int(floor.split(".")[1]), 16)], versions
    calls = {" ".join(c[:2]) for c in _make_calls(WORKFLOWS / "ci.yml")}
    assert calls == {"make lint", "make check", "make test", "make aarch64"}, calls


def test_the_mutants_shards_cover_the_set_once_each_within_the_runners_limit():
    """Shards 1..N, each running ``--shard K/N`` of the same N; the budget leaves time to finish the test runs
    it started before the job's limit, which stays under a hosted runner's 6 hours."""
    text = (WORKFLOWS / "mutants.yml").read_text()
    (matrix,) = re.findall(r"^ +shard: \[(.*)\]$", text, re.M)
    shards = [int(v) for v in matrix.split(",")]
    (n,) = set(re.findall(r"--shard \$SHARD/(\d+) ", text))
    assert shards == list(range(1, int(n) + 1)), (shards, n)
    (budget,) = re.findall(r"MUTANTS_BUDGET=(\d+)", text)
    (limit,) = re.findall(r"timeout-minutes: (\d+)", text)
    assert int(budget) + 30 <= int(limit) <= 360, (budget, limit)


def test_release_builds_once_and_publishes_without_a_stored_token():
    text = (WORKFLOWS / "release.yml").read_text()
    assert _make_calls(WORKFLOWS / "release.yml") == [["make", "dist", "TAG=$GITHUB_REF_NAME"]]
    assert "secrets." not in text and "password" not in text
    dist_job, publish_job = text.split("\n  publish:\n")
    assert "id-token" not in dist_job and "id-token: write" in publish_job
    assert "pypa/gh-action-pypi-publish@" in publish_job and "actions/attest-build-provenance@" in publish_job


@pytest.mark.parametrize("name", ["ci.yml", "release.yml"])
def test_every_action_is_pinned_by_commit_with_its_release(name):
    uses = [line.strip().removeprefix("- ") for line in (WORKFLOWS / name).read_text().splitlines()
            if line.strip().removeprefix("- ").startswith("uses:")]
    assert uses and all(PINNED.fullmatch(u) for u in uses), uses


def test_lint_checks_the_workflows():
    recipe = (ROOT / "Makefile").read_text().partition("\nlint:")[2].partition("\n\n")[0]
    assert "check-jsonschema --builtin-schema vendor.github-workflows $(WORKFLOWS)/*.yml" in recipe
    assert "zizmor --offline" in recipe and "WORKFLOWS = .github/workflows" in (ROOT / "Makefile").read_text()


def _lint(tool: str, workflow: Path) -> subprocess.CompletedProcess:
    args = {"check-jsonschema": ["--builtin-schema", "vendor.github-workflows", str(workflow)],
            "zizmor": ["--offline", str(workflow)]}[tool]
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # `make lint` runs the same, before the tests of either lane
@pytest.mark.parametrize("tool", ["check-jsonschema", "zizmor"])
def test_the_workflows_pass_the_lint(tool):
    for workflow in sorted(WORKFLOWS.glob("*.yml")):
        r = _lint(tool, workflow)
        assert r.returncode == 0, (workflow.name, r.stdout, r.stderr)


@pytest.mark.parametrize(("tool", "damage", "finding"), [
    ("check-jsonschema", ("    runs-on: ubuntu-24.04\n", "    runs_on: ubuntu-24.04\n"), "runs_on"),
    ("zizmor", ("actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1", "actions/checkout@v7"),
     "unpinned-uses"),
    ("zizmor", ("        with:\n          persist-credentials: false\n", ""), "artipacked"),
    ("zizmor", ('TAG="$GITHUB_REF_NAME"', 'TAG="${{ github.event.head_commit.message }}"'), "template-injection"),
])
def test_the_lint_finds_a_damaged_workflow(tmp_path, tool, damage, finding):
    """Each check is real: the release workflow with one thing wrong fails it, naming that thing."""
    text = (WORKFLOWS / "release.yml").read_text()
    assert damage[0] in text
    workflow = tmp_path / ".github" / "workflows" / "release.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text(text.replace(damage[0], damage[1], 1))
    r = _lint(tool, workflow)
    assert r.returncode != 0 and finding in r.stdout + r.stderr, (r.stdout, r.stderr)
