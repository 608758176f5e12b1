"""Every install command the package prints, run as printed, from a shell with the flag exported, in the world
where it is printed.

Each case builds the world (a real venv with real torch_memory_saver and NVIDIA wheels, a torch stand-in,
the host's loader cache), provokes the message with the package's own command, takes the command out of it
(the backticked span: ``env TMS_AUTOPRELOAD_DISABLE=1 <its python> -m pip install ...``, with ``ensurepip``
first where the venv has no pip, as the suite's are made) and runs it with ``sh -c`` exactly as printed, with
``SLIME_OFFLOAD_TRAIN=1`` exported; pip's own variables make the install a dry run that reports what it WOULD
install (``PIP_DRY_RUN``, ``PIP_REPORT``, ``PIP_NO_DEPS``: what the line itself asks for, no torch). Plain
``--dry-run`` exits 0 on "Requirement already satisfied", which is how the old fix for a removed build failed.
That each fix, run for real, makes the retried start go further, in every world a user builds:
tests/test_way_out.py.

tms-autopreload is not on the package index: a node without it is told the source pip recorded for the
driver's copy (PEP 610's ``direct_url.json``), and that line installs that source into a bare venv.

Each case is a pip run (seconds), most against the index: ``make test`` runs them (the fast lane runs printed
commands for real, offline, in tests/test_way_out.py's cells).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import report_host

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from support import ROOT, Venv, clean_env, find_python, run
from sandbox import clean_copy

# A printed command: a backticked span that runs pip, or uv's pip.
FIX = re.compile(r"`([^`]*\bpip (?:install|uninstall)\b[^`]*)`")


def commands(text: str) -> list[str]:
    return FIX.findall(text)


def the_command(text: str, *words: str) -> str:
    """The one printed command in ``text`` that holds every one of ``words``."""
    found = [c for c in commands(text) if all(w in c for w in words)]
    assert len(found) == 1, (found, text)
    return found[0]


def pip_args(command: str) -> list[str]:
    """What the command asks pip to install: the words after ``-m pip install`` (or ``uv pip install``), as the
    shell splits them; and it names the environment by its interpreter, unhooked."""
    last = command.split(" && ")[-1]
    assert last.startswith("env TMS_AUTOPRELOAD_DISABLE=1 "), command
    words = shlex.split(last)
    return words[words.index("install") + 1:]


def would_install(command: str, tmp: Path, env: dict[str, str] | None = None) -> dict[str, dict]:
    """{name: pip's report entry} of what ``command``, run as printed from a flagged shell, would install: its
    last step a dry run (``ensurepip`` before it, where printed, runs for real)."""
    *first, last = command.split(" && ")
    shell = clean_env(SLIME_OFFLOAD_TRAIN="1", **(env or {}))
    if first:
        r = subprocess.run(["sh", "-c", " && ".join(first)], capture_output=True, text=True, env=shell, timeout=600)
        assert r.returncode == 0, (command, r.stderr[-2000:])
    report = tmp / f"report-{uuid.uuid4().hex}.json"
    r = subprocess.run(["sh", "-c", last], capture_output=True, text=True, timeout=600,
                       env={**shell, "PIP_DRY_RUN": "1", "PIP_REPORT": str(report), "PIP_NO_DEPS": "1",
                            "PIP_QUIET": "1"})
    assert r.returncode == 0, (command, r.stderr[-2000:])
    out = {e["metadata"]["name"].lower().replace("_", "-"): e for e in json.loads(report.read_text())["install"]}
    report.unlink()
    return out


def version(entry: dict) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+]", entry["metadata"]["version"]))


# ---------------------------------------------------------------- torch_memory_saver

def _from_index(scn) -> None:
    """torch_memory_saver as pip leaves an install from the index: without the PEP 610 record that the
    suite's install from a wheel file leaves."""
    for record in scn.site.glob("torch_memory_saver-*.dist-info/direct_url.json"):
        record.unlink()


@pytest.mark.slow
@pytest.mark.parametrize("damage, said", [(lambda so: so.unlink(), "is missing"),
                                          (lambda so: so.write_bytes(b""), "is damaged (0 bytes, where pip installed")],
                         ids=["removed", "emptied"])
def test_a_removed_or_emptied_build_of_the_installed_release_is_reinstalled_as_that_release(scenario, tmp_path,
                                                                                            damage, said):
    """0.0.10 installed, its cu13 build deleted or left empty (a full disk, a cut copy: there, but not what pip
    installed), on a CUDA 13 torch: the fix forces that release again (a ``>=`` requirement would be "already
    satisfied", installing nothing)."""
    scn = scenario(tms="0.0.10", torch="cu13-sys", tag=f"cu13-{said[:10]}")
    _from_index(scn)
    damage(scn.site / "torch_memory_saver_hook_mode_preload_cu13.abi3.so")
    doc = scn.doctor()
    assert not doc["ok"]
    command = the_command(doc["fix"], "torch-memory-saver")
    assert pip_args(command) == ["--force-reinstall", "torch-memory-saver==0.0.10"], doc["fix"]
    assert f"torch_memory_saver_hook_mode_preload_cu13.abi3.so {said}" in doc["fix"], doc["fix"]
    assert version(would_install(command, tmp_path)["torch-memory-saver"]) == (0, 0, 10)


def _source_built(scn, record: dict | None) -> None:
    """Make the installed 0.0.10 a build of its own: a local version label, and pip's record of its source."""
    info = next(scn.site.glob("torch_memory_saver-*.dist-info"))
    meta = info / "METADATA"
    meta.write_text(re.sub(r"(?m)^Version: .*$", "Version: 0.0.10+source.abc123", meta.read_text()))
    (info / "direct_url.json").unlink(missing_ok=True)
    if record is not None:
        (info / "direct_url.json").write_text(json.dumps(record))
    (scn.site / "torch_memory_saver_hook_mode_preload_cu13.abi3.so").unlink(missing_ok=True)


@pytest.mark.slow
def test_a_removed_build_of_a_release_built_from_source_is_reinstalled_from_that_source(scenario, tmp_path):
    """0.0.10+source.abc123 (what a build of one's own is versioned), installed from a wheel file: its removed
    build is put back by installing that file again (pip's PEP 610 record of it), never by asking the index
    for a version it cannot have; without a record, the advice says where to get it."""
    import support

    scn = scenario(tms="0.0.10", torch="cu13-sys", tag="cu13-source-built")
    wheel = support.tms_wheel("0.0.10")
    _source_built(scn, {"url": wheel.as_uri(), "archive_info": {}})
    doc = scn.doctor()
    command = the_command(doc["fix"], "torch")
    assert pip_args(command) == ["--force-reinstall", str(wheel)], doc["fix"]
    assert "torch-memory-saver 0.0.10+source.abc123 is installed but its" in doc["fix"], doc["fix"]
    assert version(would_install(command, tmp_path)["torch-memory-saver"]) == (0, 0, 10)
    _source_built(scn, None)
    fix = scn.doctor()["fix"]
    assert "==0.0.10+source" not in fix and "reinstall it from the source it was built from" in fix, fix


@pytest.mark.slow
def test_a_removed_build_whose_recorded_wheel_file_is_gone_is_reinstalled_from_the_index(scenario, tmp_path):
    """Installed from a downloaded wheel file that was cleaned since (pip's record names a file no longer there),
    then the cu13 build deleted: the fix installs the release from the index, not the missing file."""
    import support

    scn = scenario(tms="0.0.10", torch="cu13-sys", tag="gone-wheel")
    gone = tmp_path / "downloads" / support.tms_wheel("0.0.10").name  # never made: the cleaned download
    (next(scn.site.glob("torch_memory_saver-*.dist-info")) / "direct_url.json").write_text(
        json.dumps({"url": gone.as_uri(), "archive_info": {}}))
    (scn.site / "torch_memory_saver_hook_mode_preload_cu13.abi3.so").unlink()
    command = the_command(scn.doctor()["fix"], "torch")
    assert pip_args(command) == ["--force-reinstall", "torch-memory-saver==0.0.10"], command
    assert version(would_install(command, tmp_path)["torch-memory-saver"]) == (0, 0, 10)


@pytest.mark.slow
def test_an_editable_checkout_whose_builds_were_cleaned_is_rebuilt_from_that_checkout(scenario, tmp_path):
    """``pip install -e <checkout>`` (PEP 610: dir_info, editable), the in-place builds cleaned since (``git clean
    -fdx``): pip's record beside the environment lists no build, the checkout holds none. The fix rebuilds that
    checkout; "reinstall torch-memory-saver" from the index would replace it."""
    import tms_source

    scn = scenario(tms=None, torch="cu13-sys", tag="editable")
    checkout = tms_source.unpack(tmp_path)
    (scn.site / "__editable__.torch_memory_saver-0.0.10.pth").write_text(f"{checkout}\n")
    _editable_record(scn.site, checkout, ["__editable__.torch_memory_saver-0.0.10.pth"])
    doc = scn.doctor()
    assert not doc["ok"] and doc["torch_memory_saver_dir"] == str(checkout / "torch_memory_saver"), doc
    assert doc["fix"].startswith(f"torch-memory-saver 0.0.10 is installed editable from {checkout}, which holds no "
                                 f"preload build"), doc["fix"]
    assert pip_args(the_command(doc["fix"], "torch")) == ["--force-reinstall", "-e", str(checkout)], doc["fix"]


def _editable_record(site, checkout, files):
    """pip's record of torch_memory_saver 0.0.10 installed editable from ``checkout``: its dist-info in ``site``,
    with ``files`` (what the install put in ``site``) in its RECORD."""
    info = site / "torch_memory_saver-0.0.10.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_memory_saver\nVersion: 0.0.10\n")
    (info / "direct_url.json").write_text(json.dumps({"url": checkout.as_uri(), "dir_info": {"editable": True}}))
    own = [f"{info.name}/{name}" for name in ("METADATA", "direct_url.json", "RECORD")]
    (info / "RECORD").write_text("".join(f"{name},,\n" for name in [*files, *own]))


# setuptools' editable install (PEP 660): a finder in site-packages that maps the package to its folder in the
# checkout, so that the checkout itself is never listed to import it.
EDITABLE_FINDER = """\
import importlib.util, sys
MAPPING = {'torch_memory_saver': %r}
class _EditableFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname not in MAPPING:
            return None
        return importlib.util.spec_from_file_location(fullname, MAPPING[fullname] + '/__init__.py',
                                                      submodule_search_locations=[MAPPING[fullname]])
def install():
    sys.meta_path.append(_EditableFinder)
"""


def test_an_editable_checkout_that_cannot_be_listed_is_judged_by_its_package_folder(scenario, tmp_path):
    """An editable install by setuptools' finder whose checkout can be entered, not listed (root without its
    permission bypass): what the checkout holds is judged by its package folder alone, which holds no preload
    build, so the fix rebuilds that checkout, as where the checkout can be listed."""
    from support import NO_DAC

    scn = scenario(tms=None, torch="cu13-sys", tag="editable-finder")
    checkout = tmp_path / "checkout"
    (checkout / "torch_memory_saver").mkdir(parents=True)
    (checkout / "torch_memory_saver" / "__init__.py").write_text("")
    finder = "__editable___torch_memory_saver_0_0_10_finder"
    (scn.site / f"{finder}.py").write_text(EDITABLE_FINDER % str(checkout / "torch_memory_saver"))
    (scn.site / "__editable__.torch_memory_saver-0.0.10.pth").write_text(f"import {finder}; {finder}.install()\n")
    _editable_record(scn.site, checkout, ["__editable__.torch_memory_saver-0.0.10.pth", f"{finder}.py"])
    checkout.chmod(0o311)
    try:
        r = scn.host.run([*NO_DAC, str(scn.venv.python), "-m", "tms_autopreload", "doctor", "--json"], clean_env())
    finally:
        checkout.chmod(0o755)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert doc["torch_memory_saver_dir"] == str(checkout / "torch_memory_saver"), doc
    assert doc["fix"].startswith(f"torch-memory-saver 0.0.10 is installed editable from {checkout}, which holds no "
                                 f"preload build"), doc["fix"]
    assert pip_args(the_command(doc["fix"], "pip install")) == ["--force-reinstall", "-e", str(checkout)], doc["fix"]


@pytest.mark.slow
def test_a_removed_build_of_a_target_folder_install_is_reinstalled_into_that_folder(scenario, tmp_path):
    """torch_memory_saver installed with ``pip install --target DIR`` (from the index) and found through
    ``PYTHONPATH=DIR``, its cu13 build deleted: this venv's pip would install into its own site-packages,
    behind DIR. The fix installs into DIR again, and run as printed it makes doctor answer ok."""
    import support

    scn = scenario(tms="0.0.10", torch="cu13-sys", tag="target-tms")
    target = tmp_path / "target"
    target.mkdir()
    for path in [scn.site / "torch_memory_saver", *scn.site.glob("torch_memory_saver*")]:
        if path.exists():
            shutil.move(path, target / path.name)
    for record in target.glob("torch_memory_saver-*.dist-info/direct_url.json"):
        record.unlink()
    (target / "torch_memory_saver_hook_mode_preload_cu13.abi3.so").unlink()
    env = {"PYTHONPATH": str(target)}
    doc = scn.doctor(env)
    assert not doc["ok"] and doc["torch_memory_saver_dir"] == str(target / "torch_memory_saver"), doc
    command = the_command(doc["fix"], "torch")
    assert pip_args(command) == ["--force-reinstall", "--target", str(target), "--upgrade",
                                 "torch-memory-saver==0.0.10"], command
    # Run as printed, from a flagged shell, offline from the suite's wheels: doctor then answers ok.
    r = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=600,
                       env=clean_env(SLIME_OFFLOAD_TRAIN="1", PIP_NO_INDEX="1", PIP_QUIET="1",
                                     PIP_FIND_LINKS=str(support.tms_wheel("0.0.10").parent), **env))
    assert r.returncode == 0, r.stderr
    assert scn.doctor(env)["ok"], scn.doctor(env)["error"]


@pytest.mark.slow
def test_a_release_without_any_build_left_is_reinstalled_as_that_release(scenario, tmp_path):
    scn = report_host(scenario, tag="no-builds-reinstall")
    _from_index(scn)
    for so in scn.site.glob("torch_memory_saver_*.so"):
        so.unlink()
    doc = scn.doctor()
    assert "ships no preload build" in doc["error"], doc["error"]
    command = the_command(doc["fix"], "torch-memory-saver")
    assert pip_args(command) == ["--force-reinstall", "torch-memory-saver==0.0.9.post1"], doc["fix"]
    assert version(would_install(command, tmp_path)["torch-memory-saver"]) == (0, 0, 9, 0)


@pytest.mark.slow
def test_a_cu12_only_release_on_cuda13_is_upgraded(scenario, tmp_path):
    scn = scenario(tms="0.0.9", torch="cu13-sys", host=("driver", "cuda13"), tag="cu12-only-upgraded")
    doc = scn.doctor()
    command = the_command(doc["fix"], "torch-memory-saver")
    assert pip_args(command) == ["torch-memory-saver>=0.0.9.post1"], command
    got = would_install(command, tmp_path)["torch-memory-saver"]
    assert version(got) > (0, 0, 9), got["metadata"]


@pytest.mark.slow
def test_no_release_for_the_major_installs_the_driver_only_release(scenario, tmp_path):
    """A process without torch told to use CUDA 11 (``tms-autopreload run --`` users): no release ships a CUDA
    11 build, 0.0.8's needs only the driver. (With a torch of another major the fix is to unset the override:
    tests/test_second_runtime.py.)"""
    scn = scenario(tms="0.0.10", torch=None, tag="cuda11-driver-only")
    doc = scn.doctor({"TMS_AUTOPRELOAD_CUDA_MAJOR": "11"})
    command = the_command(doc["fix"], "torch-memory-saver")
    assert pip_args(command) == ["torch-memory-saver==0.0.8"], command
    assert version(would_install(command, tmp_path)["torch-memory-saver"]) == (0, 0, 8)


@pytest.mark.slow
def test_no_torch_memory_saver_installs_it(scenario, tmp_path):
    scn = scenario(tms=None, torch="cu13-sys", tag="no-tms-installs")
    doc = scn.doctor()
    command = the_command(doc["fix"], "torch-memory-saver")
    assert "torch-memory-saver" in would_install(command, tmp_path)


@pytest.mark.slow
def test_a_single_path_release_beside_another_preload_is_upgraded(scenario, tmp_path):
    """0.0.9.post1 with another LD_PRELOAD entry: the warning's fix installs a release that splits on ':'."""
    scn = report_host(scenario, tag="single-path-upgraded")
    doc = scn.doctor({"LD_PRELOAD": str(scn.parts.stub / "libcuda.so.1")})
    warning = next(w for w in doc["warnings"] if "reads LD_PRELOAD as a single path" in w)
    command = the_command(warning, "torch-memory-saver")
    assert version(would_install(command, tmp_path)["torch-memory-saver"]) >= (0, 0, 10)


# ---------------------------------------------------------------- NVIDIA's runtime wheels, Ray, Jupyter

@pytest.mark.slow
@pytest.mark.parametrize("major, project", [(13, "nvidia-cuda-runtime"), (12, "nvidia-cuda-runtime-cu12")])
def test_a_missing_runtime_installs_nvidias_wheel_of_that_major(scenario, tmp_path, major, project):
    scn = scenario(tms="0.0.10", torch=f"cu{major}-sys", host=("driver",), tag=f"runtime-{major}-installs")
    doc = scn.doctor()
    command = the_command(doc["fix"], "nvidia-cuda-runtime")
    got = would_install(command, tmp_path)[project]
    assert version(got)[0] == major, got["metadata"]


@pytest.mark.slow
@pytest.mark.parametrize("major", [11, 12, 13])
def test_every_runtime_hint_installs_that_majors_runtime(tmp_path, major):
    """The runtime hint for each major NVIDIA publishes a wheel of (for 11 it is printed only for a source
    build that links libcudart.so.11), into a venv without any."""
    from tms_autopreload.runtime import install_hint

    # In-process, the hint is for this interpreter: the suite's own venv, where it runs as printed.
    got = would_install(the_command(install_hint("cuda", major), "pip install"), tmp_path)
    (entry,) = got.values()
    assert entry["metadata"]["name"].startswith("nvidia-cuda-runtime") and version(entry)[0] == major, got


@pytest.mark.slow
def test_no_torch_and_no_runtime_installs_the_cuda13_wheel(scenario, tmp_path):
    scn = scenario(tms="0.0.10", torch=None, host=("driver",), tag="no-runtime-installs")
    doc = scn.doctor()
    command = the_command(doc["fix"], "nvidia-cuda-runtime")
    assert version(would_install(command, tmp_path)["nvidia-cuda-runtime"])[0] == 13


@pytest.mark.slow
@pytest.mark.parametrize("argv, projects", [(["doctor", "--ray"], {"ray"}),
                                            (["kernel", "install", "--prefix", "{tmp}"],
                                             {"jupyter-client", "ipykernel"})])
def test_a_missing_tool_installs_it(scenario, tmp_path, argv, projects):
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",), tag=f"missing-{argv[0]}")
    r = scn.run(["-m", "tms_autopreload", *(a.format(tmp=tmp_path) for a in argv)])
    assert r.returncode == 2, r.stderr
    command = the_command(r.stderr, "pip install")
    assert set(would_install(command, tmp_path)) == projects


# ---------------------------------------------------------------- tms-autopreload itself

def test_the_bare_name_is_printed_nowhere():
    """No message, doc or patch tells anyone to install tms-autopreload by its name from the index."""
    bare = re.compile(r"pip install (?:-U |--upgrade )?['\"]?tms[-_]autopreload\b(?![-_/.\w])")
    for path in [*ROOT.glob("tms_autopreload/*.py"), ROOT / "README.md", *ROOT.glob("docs/*.md"),
                 *ROOT.glob("patches/*/*.patch"), *ROOT.glob("tools/*.py"), *ROOT.glob("scripts/*")]:
        if path.is_file():  # not scripts/wheels/, which `scripts/gpu-check.sh --fetch` makes
            assert not bare.search(path.read_text()), path


NOT_INSTALLED = ("import sys; from tms_autopreload.commands.doctor.node_table import not_installed; "
                 "print(not_installed('/node/venv/bin/python', '/node/venv'))")



def test_a_copy_run_from_its_checkout_advises_an_install_without_a_command():
    """This package imported from a checkout (as this test process imports it), not installed: there is no
    distribution and so no record of a source, and the advice for a node without the package says so in words,
    naming no command."""
    from importlib import metadata

    from tms_autopreload.install_source import install_advice, unknown_source

    with pytest.raises(metadata.PackageNotFoundError):
        metadata.distribution("tms-autopreload")
    python = "/usr/bin/python3"
    assert install_advice("node X", python) == f"install it into node X {unknown_source(python)}"


def test_a_fix_for_a_site_of_an_account_that_has_no_name_says_its_owner(scenario):
    """The release's CUDA 13 build removed, in a site-packages owned by a uid no account has (a volume made on
    another machine): the reinstall fix says who must run it, in words, for an account that cannot write there
    (root without its permission bypass)."""
    from support import NO_DAC

    scn = report_host(scenario, tms="0.0.10", tag="owner-without-a-name")
    (scn.site / "torch_memory_saver_hook_mode_preload_cu13.abi3.so").unlink()
    os.chown(scn.site, 4242, 4242)
    r = scn.host.run([*NO_DAC, str(scn.venv.python), "-m", "tms_autopreload", "doctor", "--json"], clean_env())
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["cause"] == "no-build-fits", doc
    assert (f"{scn.site} is not writable by this account (it belongs to its owner): run it as its owner"
            in doc["fix"]), doc["fix"]

def installed_from(tmp: Path, *pip_args: str) -> tuple[Venv, str]:
    """A venv with tms_autopreload installed by ``pip install <pip_args>``, and what ``doctor --ray`` says
    there of a node without it."""
    venv = Venv(tmp / f"from-{uuid.uuid4().hex[:8]}", find_python(f"{sys.version_info[0]}.{sys.version_info[1]}"))
    run([sys.executable, "-m", "pip", "--python", str(venv.python), "install", "-q", "--no-deps", *pip_args],
        env=clean_env())
    said = run([str(venv.python), "-c", NOT_INSTALLED], env=clean_env()).stdout
    return venv, said


def assert_installs_from(said: str, source_url: str, tmp: Path) -> None:
    """The line ``said`` names installs tms-autopreload from ``source_url`` into a bare venv (the node)."""
    assert "tms_autopreload is not installed for /node/venv/bin/python" in said
    assert "a source that may not exist on that node" in said, said
    command = the_command(said, "pip install")
    # The node's venv, with pip (as `python -m venv` makes it), where the printed python is.
    node = tmp / f"node-{uuid.uuid4().hex[:8]}"
    run([find_python(f"{sys.version_info[0]}.{sys.version_info[1]}"), "-m", "venv", str(node)], env=clean_env())
    # Run for real (a dry run's variables would reach the build backend's own pip, which then installs nothing).
    r = subprocess.run(["sh", "-c", command.replace("/node/venv/bin/python", str(node / "bin" / "python"))],
                       capture_output=True, text=True, timeout=600, env=clean_env(SLIME_OFFLOAD_TRAIN="1"))
    assert r.returncode == 0, (command, r.stderr[-2000:])
    (record,) = node.glob("lib/python*/site-packages/tms_autopreload-*.dist-info/direct_url.json")
    assert json.loads(record.read_text())["url"].rstrip("/") == source_url.rstrip("/"), command


@pytest.mark.slow
def test_a_node_without_the_package_is_told_the_wheel_the_driver_installed(parts, tmp_path):
    _, said = installed_from(tmp_path, "--no-index", str(parts.own_wheel))
    assert f"`env TMS_AUTOPRELOAD_DISABLE=1 /node/venv/bin/python -m pip install {parts.own_wheel}`" in said, said
    assert_installs_from(said, parts.own_wheel.as_uri(), tmp_path)


@pytest.mark.slow
def test_without_a_record_the_advice_names_no_package_index_command(parts, tmp_path):
    """A missing record proves nothing (an index, another installer): the advice says to install it as it
    was installed here, and its example commands are templates, not a name on the index."""
    venv, _ = installed_from(tmp_path, "--no-index", str(parts.own_wheel))
    for record in venv.site.glob("tms_autopreload-*.dist-info/direct_url.json"):
        record.unlink()
    said = run([str(venv.python), "-c", NOT_INSTALLED], env=clean_env()).stdout
    assert ("install it into the environment Ray starts that node's workers from (sys.prefix /node/venv) the way "
            "you installed it on this machine, from its wheel or checkout (`env TMS_AUTOPRELOAD_DISABLE=1 "
            "/node/venv/bin/python -m pip install --force-reinstall /path/to/tms_autopreload-<version>-py3-none-any"
            ".whl`, with the path of that file") in said, said
    assert "tms-autopreload is not on the package index" in said


def _source(tmp: Path) -> Path:
    """A copy of this checkout (what a user clones), without build outputs."""
    return clean_copy(ROOT, tmp / "checkout")


@pytest.mark.slow  # builds the package from source, with setuptools from the package index
@pytest.mark.parametrize("editable", [False, True], ids=["dir", "editable"])
def test_a_node_without_the_package_is_told_the_checkout_the_driver_installed(tmp_path, editable):
    src = _source(tmp_path)
    _, said = installed_from(tmp_path, *(["-e"] if editable else []), str(src))
    assert (f"`env TMS_AUTOPRELOAD_DISABLE=1 /node/venv/bin/python -m pip install {'-e ' if editable else ''}{src}`"
            in said), said
    assert_installs_from(said, src.as_uri(), tmp_path)


@pytest.mark.slow  # builds the package from a git clone, with setuptools from the package index
def test_a_node_without_the_package_is_told_the_commit_the_driver_installed(tmp_path):
    src = _source(tmp_path)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        run(["git", *args], cwd=src)
    commit = run(["git", "rev-parse", "HEAD"], cwd=src).stdout.strip()
    _, said = installed_from(tmp_path, f"git+{src.as_uri()}")
    assert f"-m pip install git+{src.as_uri()}@{commit}`" in said, said
    assert_installs_from(said, src.as_uri(), tmp_path)
