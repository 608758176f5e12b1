"""The patches users copy (patches/, the diffs shown in docs/integrations.md, the line the README shows).

Each patch is applied with the real ``git apply`` to a pre-image rebuilt from its own context and
removed lines, placed at the line numbers its hunk headers give: a hunk whose line counts or
positions are wrong fails here as it would for a user ("corrupt patch"). Each names, in its header,
the upstream commit it was checked against.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATCHES = sorted((ROOT / "patches").rglob("*.patch"))
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
CHECKED = re.compile(r"Checked with `git apply --check` against (\S+/\S+) ([0-9a-f]{40})\b")


def parse(text: str) -> tuple[str, list[tuple[int, list[str], list[str]]]]:
    """(target path, hunks as (old start, old lines, new lines)) of a one-file git diff."""
    target = re.search(r"^--- a/(\S+)$", text, re.M).group(1)
    hunks, lines = [], text[text.index("\n@@") + 1:].splitlines()
    for line in lines:
        m = HUNK.match(line)
        if m:
            hunks.append((int(m.group(1)), [], []))
        elif line[:1] in (" ", "-", "+") or line == "":
            body = line[1:]
            if line[:1] in (" ", "-", ""):
                hunks[-1][1].append(body)
            if line[:1] in (" ", "+", ""):
                hunks[-1][2].append(body)
    return target, hunks


def pre_image(hunks) -> str:
    """Filler lines, with each hunk's old lines placed at the line its header names."""
    out: list[str] = []
    for start, old, _ in hunks:
        while len(out) < start - 1:
            out.append(f"# filler line {len(out) + 1}")
        out.extend(old)
    out += [f"# filler line {len(out) + i + 1}" for i in range(3)]
    return "\n".join(out) + "\n"


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def test_there_are_patches_for_every_slime_shape():
    names = {p.name for p in PATCHES if p.parent.name == "slime"}
    assert names == {"v0.2.4.patch", "8f732538a-cu12-first.patch", "main-624b824a8.patch"}


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_patch_applies_to_its_own_pre_image(patch, tmp_path):
    text = patch.read_text()
    assert CHECKED.search(text), "the header must name the upstream commit the patch was checked against"
    target, hunks = parse(text)
    assert hunks
    file = tmp_path / target
    file.parent.mkdir(parents=True)
    file.write_text(pre_image(hunks))
    assert git(tmp_path, "init", "-q").returncode == 0
    r = git(tmp_path, "apply", "--check", str(patch))
    assert r.returncode == 0, r.stderr
    assert git(tmp_path, "apply", str(patch)).returncode == 0
    result = file.read_text().splitlines()
    for _, _, new in hunks:
        assert any(result[i:i + len(new)] == new for i in range(len(result))), "post-image not found"


def _diff_blocks(doc: Path) -> list[str]:
    return re.findall(r"```diff\n(.*?)```\n", doc.read_text(), re.S)


def _body(patch: Path) -> str:
    text = patch.read_text()
    return text[text.index("diff --git"):]


def test_readme_change_is_the_slime_patches_added_line():
    """The README shows the change as the one line it adds; every slime patch adds exactly that line."""
    shown = re.search(r"(?m)^(env_vars\[\"SLIME_OFFLOAD_TRAIN\"\] = \"1\")", (ROOT / "README.md").read_text()).group(1)
    for patch in sorted((ROOT / "patches" / "slime").glob("*.patch")):
        added = [line[1:].strip() for line in _body(patch).splitlines()
                 if line.startswith("+") and not line.startswith("+++")]
        assert shown in added, patch.name


def test_integration_docs_show_the_patches_verbatim():
    blocks = _diff_blocks(ROOT / "docs" / "integrations.md")
    assert blocks == [_body(ROOT / "patches" / "slime" / "main-624b824a8.patch"),
                      _body(ROOT / "patches" / "sglang" / "torch_memory_saver_adapter.patch")]


def test_a_malformed_patch_is_caught(tmp_path):
    """The check itself can fail: the README's earlier diff had hunk counts of 27/10 for 27/8 lines."""
    bad = tmp_path / "bad.patch"
    body = _body(ROOT / "patches" / "slime" / "main-624b824a8.patch")
    bad.write_text(re.sub(r"\+71,(\d+) @@", lambda m: f"+71,{int(m.group(1)) + 2} @@", body, count=1))
    target, hunks = parse(bad.read_text())
    (tmp_path / target).parent.mkdir(parents=True)
    (tmp_path / target).write_text(pre_image(hunks))
    git(tmp_path, "init", "-q")
    r = git(tmp_path, "apply", "--check", str(bad))
    assert r.returncode != 0 and "corrupt patch" in r.stderr, r.stderr


def test_torch_memory_saver_patches_apply_to_its_released_source(tmp_path):
    """The 0.0.10 sdist carries the mode_preload.py and setup.py of upstream main 4a43c97 (its version
    string aside). Each source build's patches apply, in order, with ``git apply`` to those real files:
    the shipped patch to the released tree and to the tree with the model of #108 (the tree users will
    have next), and the model itself to the released tree."""
    import support  # noqa: F401 - puts tools/ on sys.path
    from tms_source import SOURCE_BUILDS, unpack

    shipped = ROOT / "patches" / "torch_memory_saver" / "main-4a43c97.patch"
    model = ROOT / "tests" / "data" / "torch_memory_saver-runpath-model.patch"
    assert {tuple(p.name for p in build) for build in SOURCE_BUILDS.values()} >= {
        (shipped.name,), (model.name,), (model.name, shipped.name)}
    for name, patches in SOURCE_BUILDS.items():
        src = unpack(tmp_path / name)
        for patch in patches:
            r = git(src, "apply", "--check", str(patch))
            assert r.returncode == 0, (name, patch.name, r.stderr)
            assert git(src, "apply", str(patch)).returncode == 0, (name, patch.name)



def test_the_sdist_unpacks_alike_where_tarfile_has_no_extraction_filters(tmp_path, monkeypatch):
    """CPython before 3.11.4 (Debian bookworm's 3.11.2, CI's image) has no ``tarfile`` filters: the source
    builds unpack the same tree there (on 3.14 and later, whose plain extraction filters anyway, the same
    still), and a member the "data" filter would refuse stops with the cause."""
    import tarfile

    import support  # noqa: F401 - puts tools/ on sys.path
    import tms_source
    from basics import SetupError

    def tree(root: Path) -> list[tuple[str, int, int, int]]:
        return sorted((str(f.relative_to(root)), f.stat().st_size, f.stat().st_mode & 0o7777, f.stat().st_uid)
                      for f in root.rglob("*"))

    filtered = tree(tms_source.unpack(tmp_path / "filtered"))
    monkeypatch.setattr(tms_source, "TAR_FILTERS", False)
    assert tree(tms_source.unpack(tmp_path / "plain")) == filtered and filtered
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(ROOT / "README.md", arcname="../outside")
    monkeypatch.setattr(tms_source, "sdist", lambda: bad)
    with pytest.raises(SetupError, match=r"holds members an sdist should not: \.\./outside"):
        tms_source.unpack(tmp_path / "bad")
    assert not (tmp_path / "outside").exists()


# ---------------------------------------------------------------- AReaL and miles

def test_there_are_patches_for_every_areal_and_miles_shape():
    names = {f"{p.parent.name}/{p.name}" for p in PATCHES if p.parent.name in ("areal", "miles")}
    assert names == {"areal/228d46192.patch", "areal/main-4aef98d8d.patch",
                     "miles/06de48eec.patch", "miles/main-31f1ca961.patch"}


def test_areal_main_patch_applies_to_areals_released_file(tmp_path):
    """AReaL publishes wheels: its ``areal/utils/offload.py`` of ``areal==1.0.4`` is the blob the main
    patch was made from (its index line), and ``git apply --check`` takes the patch on that real file."""
    import zipfile

    from support import wheel

    patch = ROOT / "patches" / "areal" / "main-4aef98d8d.patch"
    target = tmp_path / "areal" / "utils" / "offload.py"
    target.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel("areal==1.0.4")) as z:
        target.write_bytes(z.read("areal/utils/offload.py"))
    assert git(tmp_path, "init", "-q").returncode == 0
    index = next(line for line in patch.read_text().splitlines() if line.startswith("index "))
    assert git(tmp_path, "hash-object", str(target)).stdout.startswith(index.split()[1].split("..")[0])
    r = git(tmp_path, "apply", "--check", str(patch))
    assert r.returncode == 0, r.stderr


def test_patches_the_docs_name_exist():
    """Every ``patches/...`` file README.md and docs/integrations.md tell users to apply is shipped."""
    for doc in (ROOT / "README.md", ROOT / "docs" / "integrations.md"):
        for name in set(re.findall(r"patches/[\w.-]+/[\w.-]+\.patch", doc.read_text())):
            assert (ROOT / name).is_file(), f"{doc.name} names {name}, which is not shipped"


# ---------------------------------------------------------------- the driver-side check each patch keeps

def changed_code(patch: Path, side: str) -> tuple[str, str]:
    """(code, the call that runs it) of the block a slime, miles or AReaL patch changes, as its pre-image
    (``before``) or post-image (``after``) has it: slime's and miles' ``offload_train`` block (dedented),
    AReaL's ``get_tms_env_vars()``."""
    import textwrap

    _, hunks = parse(patch.read_text())
    (_, old, new), = hunks
    lines = old if side == "before" else new
    if patch.parent.name == "areal":
        i = next(j for j, line in enumerate(lines) if line.startswith("def get_tms_env_vars"))
        # The hunk ends at the dict; the line after it in AReaL's file (areal 1.0.4's offload.py) returns it.
        return "\n".join([*lines[i:], "    return env_vars"]) + "\n", "env_vars = get_tms_env_vars()"
    i = next(j for j, line in enumerate(lines) if line.lstrip().startswith("if ") and "offload_train" in line)
    indent = len(lines[i]) - len(lines[i].lstrip())
    end = next((j for j in range(i + 1, len(lines))
                if lines[j].strip() and len(lines[j]) - len(lines[j].lstrip()) <= indent), len(lines))
    return textwrap.dedent("\n".join(lines[i:end])) + "\n", ""


DRIVER_SIDE = r"""
import json, os, sys, types
code, call, path = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path[:0] = path
args = types.SimpleNamespace(offload_train=True, train_backend='megatron', offload_train_target='cpu')
scope = {'os': os, 'self': types.SimpleNamespace(args=args), 'args': args, 'env_vars': {}}
try:
    exec(code, scope)
    exec(call, scope)
    print(json.dumps({'env_vars': scope['env_vars']}))
except Exception as exc:
    print(json.dumps({'raised': type(exc).__name__, 'message': str(exc)}))
"""

DRIVER_CHECKS = sorted(p for p in PATCHES if p.parent.name in ("slime", "miles", "areal"))


@pytest.fixture(scope="module")
def tms_package(tmp_path_factory):
    """A directory holding the real torch_memory_saver package (0.0.10's wheel), as a node has it."""
    import zipfile

    from support import tms_wheel

    dest = tmp_path_factory.mktemp("tms-package")
    with zipfile.ZipFile(tms_wheel("0.0.10")) as z:
        z.extractall(dest, [n for n in z.namelist() if n.startswith("torch_memory_saver/")])
    return dest


def driver_side(patch: Path, side: str, *path: Path) -> dict:
    """Run the changed block on a driver whose interpreter sees only the standard library and ``path``."""
    import json
    import sys

    code, call = changed_code(patch, side)
    r = subprocess.run([sys.executable, "-I", "-S", "-c", DRIVER_SIDE, code, call, *map(str, path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("patch", DRIVER_CHECKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_driver_still_fails_fast_without_the_packages(patch, tms_package):
    """Each patched block keeps the early failure that its ``import torch_memory_saver`` gave on the driver:
    where tms_autopreload (or torch_memory_saver) is not importable it raises at once, naming the package,
    this interpreter and how to install it (tms-autopreload from its wheel or checkout, never by name);
    with both, it sets the flag."""
    before = driver_side(patch, "before")  # the upstream code on a driver without torch_memory_saver
    assert before.get("raised") == "ModuleNotFoundError" and "torch_memory_saver" in before["message"], before
    ok = driver_side(patch, "after", tms_package, ROOT)
    assert "raised" not in ok and {"SLIME_OFFLOAD_TRAIN", "TMS_AUTOPRELOAD"} & set(ok["env_vars"]), ok
    for present, missing, fix in ((tms_package, "tms_autopreload", "-m pip install /path/to/tms_autopreload-"),
                                  (ROOT, "torch_memory_saver", "-m pip install torch-memory-saver")):
        got = driver_side(patch, "after", present)
        # The fix runs as printed from a shell with the flag exported, for the driver's own interpreter.
        fix = f"Fix: env TMS_AUTOPRELOAD_DISABLE=1 {sys.executable} {fix}"
        assert got.get("raised") in ("ModuleNotFoundError", "RuntimeError"), (missing, got)
        assert got["message"].startswith(f"offload needs {missing} on every node; it is not installed for "), got
        assert fix in got["message"], got
    assert "not on the package index" in driver_side(patch, "after", tms_package)["message"]
