"""`make demo`: both halves of the bug (the original report on a CUDA 13 node, slime main's cu13-first pick on a
CUDA 12 node), each fixed by the flag, then the doctor, end to end."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from support import ROOT, clean_env

import demo  # tools/, on sys.path through support


def removed_code(patch: str) -> str:
    text = (ROOT / "patches" / "slime" / patch).read_text()
    return "\n".join(line[1:] for line in text[text.index("\n@@"):].splitlines() if line.startswith("-"))


def test_the_demos_account_of_each_slime_version_is_that_versions_code():
    """The names the demo says each slime version tries, in order, are the names in the code the patch for
    that version removes; a version with one name asserts that it exists; every slime patch is accounted for."""
    assert {s.patch for s in demo.SLIMES} == {p.name for p in (ROOT / "patches" / "slime").glob("*.patch")}
    for slime in demo.SLIMES:
        code = removed_code(slime.patch)
        names = tuple(re.findall(r'"(torch_memory_saver_hook_mode_preload[\w.]*\.so)"', code))
        assert names == slime.names, slime.patch
        asserts = re.search(r"assert os\.path\.exists\(dynlib_path\)", code) is not None
        assert asserts == (len(slime.names) == 1) == ("asserted to exist" in slime.rule()), slime.patch
    labels = {s.patch: s.label for s in demo.SLIMES}
    assert labels["v0.2.4.patch"].startswith("slime v0.2.4 ") and "cu12 first" not in labels["v0.2.4.patch"]
    assert "cu12 first" in labels["8f732538a-cu12-first.patch"] and "cu13 first" in labels["main-624b824a8.patch"]


def test_the_troubleshooting_page_says_what_each_slime_version_tries():
    """docs/troubleshooting.md's account of slime's picks, against the same code: v0.2.4 names only the
    unsuffixed build; the cu12-first list is slime's main before a74ae3a0a; main tries cu13 first."""
    text = " ".join((ROOT / "docs" / "troubleshooting.md").read_text().split())
    v024 = re.search(r"slime v0\.2\.4 [^.]*\.", text).group(0)
    assert "only the unsuffixed" in v024 and "(cu12" not in v024 and "cu12 first" not in v024, v024
    before = re.search(r"slime's main before a74ae3a0a[^.]*\.", text).group(0)
    assert "(cu12, unsuffixed)" in before, before
    assert "picks the first existing name of (cu13, cu12, unsuffixed)" in text


def _build_leftovers() -> dict[str, int]:
    """What an in-place build leaves in the checkout (setuptools' build/lib and egg-info), with its times: a
    second distribution of the package to everything run from the checkout."""
    return {str(p): p.stat().st_mtime_ns for p in [*ROOT.glob("*.egg-info"), ROOT / "build" / "lib"] if p.exists()}


@pytest.mark.slow  # the whole demo, with its own downloads and venvs
def test_demo_end_to_end(tmp_path):
    sandbox = tmp_path / "demo"
    t0 = time.monotonic()
    before = _build_leftovers()
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--dir", str(sandbox)],
                       capture_output=True, text=True, timeout=600, env=clean_env())
    print(f"demo: {time.monotonic() - t0:.1f} s")
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert _build_leftovers() == before  # the wheel was built from a copy: nothing new in the checkout
    one, two, three, four, five = (out.index(f"== {n}.") for n in (1, 2, 3, 4, 5))
    assert one < two < three < four < five
    report, slime_main = out[one:two], out[two:three]
    assert "picked torch_memory_saver_hook_mode_preload_cu12.abi3.so on this CUDA 13 node" in report
    assert "picked torch_memory_saver_hook_mode_preload.abi3.so on this CUDA 13 node" in report  # v0.2.4
    assert report.count("exit 127: ") == 2, report
    assert "exit 127: bash: error while loading shared libraries: libcudart.so.12: cannot open shared object " \
           "file" in report, report
    assert "picked torch_memory_saver_hook_mode_preload_cu13.abi3.so on this CUDA 12 node" in slime_main
    assert "exit 127: " in slime_main and "error while loading shared libraries: libcudart.so.13: cannot open " \
           "shared object file" in slime_main, slime_main
    fixed = out[three:four]
    cuda13, cuda12 = fixed.split("CUDA 12 node:")
    assert "_cu13.abi3.so" in cuda13 and "libcudart copies mapped: 1" in cuda13 and "its bash child: exit 0" in cuda13
    assert "_cu12.abi3.so" in cuda12 and "libcudart copies mapped: 1" in cuda12 and "its bash child: exit 0" in cuda12
    assert "CHOSEN" in out[four:five] and "STAND-IN" in out  # stand-ins are said on screen
    assert str(sandbox) in out[five:]
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--dir", str(sandbox), "--clean"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not sandbox.exists()
