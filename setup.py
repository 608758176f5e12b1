"""Ship ``tms_autopreload.pth`` at the root of site-packages.

setuptools has no option for a top-level data file in a wheel, so ``build_py`` copies it
into the build directory and declares it as an output (wheels and sdists), and
``editable_wheel`` appends it to the editable wheel (coverage.py does the same).
Everything else is in pyproject.toml.

No PEP 829 ``.start`` file: on CPython 3.15 its mere presence makes site.py import ``pkgutil``
(with ``importlib.util`` and ``weakref``) and then this package in every interpreter, flag or
not, which made each start 1.7-1.8x slower; the ``.pth`` import line runs on every CPython
up to 3.17 (docs/performance.md, "Python 3.15 and later").
"""

import os
import zipfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

STARTUP_FILES = ("tms_autopreload.pth",)


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
    def _create_wheel_file(self, bdist_wheel):  # noqa: ANN001, ANN202 - setuptools internal hook
        wheel_path = super()._create_wheel_file(bdist_wheel)
        with zipfile.ZipFile(wheel_path, "a") as wheel:
            for name in STARTUP_FILES:
                wheel.write(name, name)
        return wheel_path


setup(cmdclass={"build_py": BuildPyWithStartup, "editable_wheel": EditableWheelWithStartup})
