"""Issue 7: the one-command demo runs end to end and shows the crash, the fix and the doctor."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import ROOT, clean_env


@pytest.mark.slow  # the whole demo, with its own downloads and venvs
def test_demo_end_to_end(tmp_path):
    sandbox = tmp_path / "demo"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--dir", str(sandbox)],
                       capture_output=True, text=True, timeout=600, env=clean_env())
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    one, two, three, four = (out.index(f"== {n}.") for n in (1, 2, 3, 4))
    assert one < two < three < four
    crash = out[one:two]
    assert ("exit 127: bash: error while loading shared libraries: libcudart.so.12: cannot open shared object file"
            in crash) or "does not reproduce here" in crash
    fixed = out[two:three]
    assert "_cu13.abi3.so" in fixed and "libcudart copies mapped: 1" in fixed and "its bash child: exit 0" in fixed
    assert "CHOSEN" in out[three:four] and "STAND-IN" in out  # stand-ins are said on screen
    assert str(sandbox) in out[four:]
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--dir", str(sandbox), "--clean"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not sandbox.exists()
