"""docs/troubleshooting.md: one section per error text users see, each naming the tests that back it.
Every named test must exist, so that the page cannot point at a test that was renamed or removed."""

from __future__ import annotations

import re

from support import ROOT

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
