"""Ship ``tms_autopreload.pth`` and the two modules it starts at the root of site-packages.

setuptools has no option for a top-level data file in a wheel, so ``build_py`` copies it
into the build directory and declares it as an output (wheels and sdists), and
``editable_wheel`` appends it to the editable wheel (coverage.py does the same).
Everything else is in pyproject.toml.

No PEP 829 ``.start`` file: on CPython 3.15 its mere presence makes site.py import ``pkgutil``
(with ``importlib.util`` and ``weakref``) and then this package in every interpreter, flag or
not, which made each start 1.7-1.8x slower; the ``.pth`` import line runs on every CPython
up to 3.17 (docs/performance.md, "Python 3.15 and later").

``sdist`` writes its tarball itself when ``SOURCE_DATE_EPOCH`` is set, so that the same source and
epoch give the same bytes (``make dist``, tools/dist.py); the wheel built from that sdist then is too.
"""

import gzip
import os
import sys
import tarfile
import zipfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel
from setuptools.command.sdist import sdist

# The start-up files, written by tools/pthfile.py: the .pth line, the entry it imports where a flag is set,
# and what that entry runs where the package is gone.
STARTUP_FILES = ("tms_autopreload.pth", "_tms_autopreload_start.py", "_tms_autopreload_left_over.py")


class BuildPyWithStartup(build_py):
    def run(self) -> None:
        super().run()
        for name in STARTUP_FILES:
            self.copy_file(name, os.path.join(self.build_lib, name), preserve_mode=0)

    def get_outputs(self, include_bytecode: bool = True) -> list:
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, n) for n in STARTUP_FILES]

    def get_output_mapping(self) -> dict:
        mapping = super().get_output_mapping()
        mapping.update({os.path.join(self.build_lib, n): n for n in STARTUP_FILES})
        return mapping

    def get_source_files(self) -> list:
        return super().get_source_files() + list(STARTUP_FILES)


class EditableWheelWithStartup(editable_wheel):
    """The start-up files of an editable install, its start module importing the checkout's entry: the one
    of a wheel holds a copy of the package's start-up rules, which would keep the rules of the day of the
    install while the checkout's change (tools/pthfile.py, ``editable_start``)."""

    def _create_wheel_file(self, bdist_wheel):  # noqa: ANN001, ANN202 - setuptools internal hook
        wheel_path = super()._create_wheel_file(bdist_wheel)
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools"))
        from pthfile import START, editable_start  # the checkout's own generator: an editable install has one

        with zipfile.ZipFile(wheel_path, "a") as wheel:
            for name in STARTUP_FILES:
                with open(name) as f:
                    text = f.read()
                wheel.writestr(name, editable_start(text) if name == f"{START}.py" else text)
        return wheel_path


def _normalized(member: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    """``member`` as any checkout gives it: the epoch's time, root's ownership without names, and 0644
    (0755 for directories and executables) whatever the umask or the file system's owner."""
    member.mtime = epoch
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    member.mode = 0o755 if member.isdir() or member.mode & 0o100 else 0o644
    return member


class ReproducibleSdist(sdist):
    """setuptools' tarball takes each file's time, mode and owner from the checkout, and gzip's header the
    time of the build: with ``SOURCE_DATE_EPOCH`` set, every member and the header get that time instead,
    members are normalized (:func:`_normalized`) and stored in name order (``tarfile.add`` sorts)."""

    def make_archive(self, base_name: str, format: str, root_dir: str | None = None,
                     base_dir: str | None = None, owner: str | None = None, group: str | None = None) -> str:
        epoch = os.environ.get("SOURCE_DATE_EPOCH")
        if format != "gztar" or epoch is None or base_dir is None:
            return super().make_archive(base_name, format, root_dir, base_dir, owner, group)
        archive = f"{base_name}.tar.gz"
        source = os.path.join(root_dir or os.curdir, base_dir)
        with open(archive, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=int(epoch)) as packed, \
                tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(source, arcname=base_dir, filter=lambda m: _normalized(m, int(epoch)))
        return archive


setup(cmdclass={"build_py": BuildPyWithStartup, "editable_wheel": EditableWheelWithStartup,
                "sdist": ReproducibleSdist})
