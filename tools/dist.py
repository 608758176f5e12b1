"""``make dist``: the sdist and the wheel built from it, the same bytes on every build of the same source,
then checked as the package index checks them.

Built as a packager builds (``python -m build``: the sdist, then the wheel from that sdist), from a clean
copy of the checkout (nothing of an earlier build or a venv can leak in), without build isolation: the
setuptools tests/requirements.txt pins builds, so that a rebuild uses the same backend.

Reproducible: the time every file carries is ``SOURCE_DATE_EPOCH``, by default the last commit's time;
setup.py's sdist normalizes its tarball with it and the wheel takes its file times from it, so two builds
of the same source with the same epoch are byte-identical (tests/test_packaging.py builds twice).

Checked: ``twine check --strict`` (the metadata and README as the index renders them) and
``check-wheel-contents`` (what the wheel holds), both pinned in tests/requirements.txt. With ``--tag``
(the release workflow passes the pushed tag), the tag must name the version built.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from basics import ROOT, SetupError, run  # noqa: E402
from sandbox import clean_copy  # noqa: E402

# The checkers, installed next to this interpreter by tests/requirements.txt.
BIN = Path(sys.executable).parent


def source_date_epoch(source: Path) -> str:
    """``SOURCE_DATE_EPOCH`` when set, else the time of ``source``'s last commit."""
    if "SOURCE_DATE_EPOCH" in os.environ:
        epoch = os.environ["SOURCE_DATE_EPOCH"]
        if not epoch.isdigit():
            raise SetupError(f"SOURCE_DATE_EPOCH={epoch!r} is not a time: set it to seconds since 1970 (the last "
                             "commit's: SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)), or unset it")
        return epoch
    got = subprocess.run(["git", "-C", str(source), "log", "-1", "--format=%ct"], capture_output=True, text=True)
    if got.returncode != 0 or not got.stdout.strip().isdigit():
        raise SetupError(f"{source} is not a git checkout with a commit, so the build has no time to give its "
                         "files: set SOURCE_DATE_EPOCH (seconds since 1970, e.g. SOURCE_DATE_EPOCH=$(date +%s))")
    return got.stdout.strip()


def build(source: Path, out: Path, epoch: str) -> tuple[Path, Path]:
    """The sdist and the wheel built from it, in ``out`` (emptied first): ``(sdist, wheel)``."""
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="tms-dist-") as tmp:
        src = clean_copy(source, Path(tmp) / "src")
        # umask 022: setuptools writes the wheel's files under the umask, and the wheel keeps their modes.
        run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
            env={**os.environ, "SOURCE_DATE_EPOCH": epoch}, umask=0o022)
    (sdist,) = out.glob("tms_autopreload-*.tar.gz")
    (wheel,) = out.glob("tms_autopreload-*.whl")
    return sdist, wheel


def check(sdist: Path, wheel: Path) -> None:
    """What the index checks, and what a wheel should hold; raises SetupError with the checkers' words."""
    run([str(BIN / "twine"), "check", "--strict", str(sdist), str(wheel)])
    run([str(BIN / "check-wheel-contents"), str(wheel)])


def check_tag(tag: str, wheel: Path) -> None:
    """A release tag names the version it releases: ``v0.1.0`` for tms_autopreload-0.1.0-*.whl."""
    version = wheel.name.split("-")[1]
    if tag != f"v{version}":
        raise SetupError(f"the tag {tag} does not name the version built ({version}): tag the commit v{version}, "
                         "or change __version__ in tms_autopreload/__init__.py to the tag's")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the sdist and wheel go (emptied)")
    parser.add_argument("--tag", help="the release tag; it must be v<version>")
    args = parser.parse_args(argv)
    try:
        sdist, wheel = build(ROOT, args.out, source_date_epoch(ROOT))
        check(sdist, wheel)
        if args.tag is not None:
            check_tag(args.tag, wheel)
    except SetupError as exc:
        print(f"dist: {exc}", file=sys.stderr)
        return 1
    for path in (sdist, wheel):
        print(path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
