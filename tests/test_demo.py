"""`make demo`: both halves of the bug (the original report on a CUDA 13 node, slime main's cu13-first pick on a
CUDA 12 node), each fixed by the flag, then the doctor, end to end."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from support import ROOT, clean_env


@pytest.mark.slow  # the whole demo, with its own downloads and venvs
def test_demo_end_to_end(tmp_path):
    sandbox = tmp_path / "demo"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--dir", str(sandbox)],
                       capture_output=True, text=True, timeout=600, env=clean_env())
    print(f"demo: {time.monotonic() - t0:.1f} s")
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    one, two, three, four, five = (out.index(f"== {n}.") for n in (1, 2, 3, 4, 5))
    assert one < two < three < four < five
    report, slime_main = out[one:two], out[two:three]
    assert "picked torch_memory_saver_hook_mode_preload_cu12.abi3.so on this CUDA 13 node" in report
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
