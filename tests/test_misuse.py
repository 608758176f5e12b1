"""The mistakes users make, each met with a clear message and a conventional exit code, never with lost
data, a process left behind, or a silent no-op: the command line's parsers, Jupyter kernels next to
other kernels, ``configure_subprocess()`` under each ``multiprocessing`` start method, and
``doctor --deep`` interrupted by a signal.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time

import pytest
from conftest import report_host
from support import MAPPED, ROOT, clean_env

CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"


def cli(scn, *args, env=None, **kw):
    return scn.run(["-m", "tms_autopreload", *args], env, **kw)


def refused_as_usage(r, words: str) -> None:
    """Exit 2, argparse's usage line, and the reason; nothing on stdout, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("usage: tms-autopreload"), r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr and r.stdout == "", r.stderr


# ---------------------------------------------------------------- the parsers

@pytest.mark.parametrize("argv, words", [
    (["doctor", "--mode", "dlopen", "--address", "x"], "--address"),
    (["doctor", "--deep", "--ray"], "--ray"),
    (["doctor", "--mode", "dlopen"], "--mode only with --deep"),
    (["doctor", "--import", "numpy"], "--import only with --deep"),
    (["doctor", "--as-is"], "--as-is only with --deep"),
    (["doctor", "--deep", "--as-is", "--mode", "dlopen"], "--as-is"),
    (["doctor", "--timeout", "5"], "--timeout only with --ray"),
    (["doctor", "--runtime-env", "{}"], "--runtime-env only with --ray"),
    (["doctor", "--nodes", "-", "--deep"], "not allowed with argument --nodes"),
    (["doctor", "--nodes", "-", "--timeout", "5"], "--timeout only with --ray"),
    (["kernel", "uninstall", "--env", "A=1"], "unrecognized arguments: --env"),
    (["kernel", "uninstall", "--display-name", "x"], "unrecognized arguments: --display-name"),
    (["kernel"], "required"),
    (["run", "--", ""], "the command name is empty"),
])
def test_options_that_cannot_go_together_are_usage_errors(scenario, argv, words):
    refused_as_usage(cli(report_host(scenario), *argv), words)


def test_kernel_subcommands_have_their_own_help(scenario):
    scn = report_host(scenario)
    install = cli(scn, "kernel", "install", "--help")
    uninstall = cli(scn, "kernel", "uninstall", "--help")
    assert install.returncode == uninstall.returncode == 0, install.stderr + uninstall.stderr
    assert install.stdout.startswith("usage: tms-autopreload kernel install")
    assert uninstall.stdout.startswith("usage: tms-autopreload kernel uninstall")
    for option in ("--display-name", "--env", "--name", "--prefix"):
        assert option in install.stdout
    assert "--name" in uninstall.stdout and "--env" not in uninstall.stdout
    assert "--display-name" not in uninstall.stdout
    # Where a kernel is without a location option: jupyter_client decides, and it is not installed here (a
    # scenario with it: test_kernel_install_help_says_where_it_goes_without_a_location_and_uninstall_...).
    python = scn.run(["-c", "import sys; print(sys.executable)"]).stdout.strip()
    assert (f"Without --user, --sys-prefix or --prefix: jupyter_client's system-wide kernels folder (not known "
            f"here: jupyter_client is not installed for {python})") in " ".join(install.stdout.split()), install.stdout
    assert ("Without --user, --sys-prefix or --prefix: the kernel of that name that Jupyter finds"
            in " ".join(uninstall.stdout.split())), uninstall.stdout


def exit_rows(help_text: str) -> list[str]:
    """The exit-code lines of ``--help``'s epilog: '  N  meaning'."""
    lines = help_text.split("exit codes:", 1)[1].splitlines()
    return [line.strip() for line in lines if line.strip()[:1].isdigit()]


def test_help_and_readme_give_one_exit_code_table(scenario):
    scn = report_host(scenario)
    r = cli(scn, "--help")
    assert r.returncode == 0
    rows = exit_rows(r.stdout)
    assert [row.split()[0] for row in rows] == ["0", "1", "2", "78", "126/127", "129/130/143"], rows
    reference = (ROOT / "docs" / "reference.md").read_text()
    for row in rows:  # the reference's table has the same rows: `code` | meaning
        code, meaning = row.split(None, 1)
        assert f"| `{code}` | {meaning} |" in reference, row


def test_version(scenario):
    scn = report_host(scenario)
    r = cli(scn, "--version")
    version = scn.run(["-c", "import tms_autopreload; print(tms_autopreload.__version__)"]).stdout.strip()
    assert r.returncode == 0 and r.stdout == f"tms-autopreload {version}\n", r.stdout + r.stderr


@pytest.mark.parametrize("argv", [["which"], ["env"], ["env", "--json"], ["doctor"], ["doctor", "--json"],
                                  ["--version"], ["kernel", "install", "--help"]])
def test_a_full_disk_is_a_write_error_not_a_traceback(scenario, argv):
    """As coreutils says it: ``printf x > /dev/full`` -> ``write error: No space left on device``, exit 1."""
    scn = report_host(scenario)
    with open("/dev/full", "w") as full:
        r = cli(scn, *argv, capture_output=False, stdout=full, stderr=subprocess.PIPE)
    assert r.returncode == 1 and r.stderr == "tms-autopreload: write error: No space left on device\n", r.stderr


# ---------------------------------------------------------------- Jupyter kernels

def kernel(scn, *args, env=None):
    return scn.run(["-m", "tms_autopreload", "kernel", *args], env)


def test_kernel_install_never_replaces_a_kernel_it_did_not_write(real_torch, tmp_path):
    """A third-party kernelspec (with a logo) in the target directory, and ipykernel's own ``python3``:
    both refused, named, with the fix; nothing of theirs changed. Our own kernel is replaced."""
    scn = real_torch(("driver",))
    kernels = tmp_path / "share" / "jupyter" / "kernels"
    foreign = kernels / "foreign"
    foreign.mkdir(parents=True)
    spec = json.dumps({"argv": ["python3"], "display_name": "Foreign", "language": "python"})
    (foreign / "kernel.json").write_text(spec)
    (foreign / "logo-64x64.png").write_bytes(b"\x89PNG")
    r = kernel(scn, "install", "--prefix", str(tmp_path), "--name", "foreign")
    assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
    assert str(foreign) in r.stderr and "was not installed by tms-autopreload" in r.stderr, r.stderr
    assert "choose another --name" in r.stderr
    assert (foreign / "kernel.json").read_text() == spec and (foreign / "logo-64x64.png").exists()

    # A home that exists: where it does not, IPython's get_ipython_dir() makes a tempfile.mkdtemp() directory
    # in /tmp for each run, and never removes it.
    (tmp_path / "home").mkdir()
    home = {"HOME": str(tmp_path / "home")}
    r = kernel(scn, "install", "--user", "--name", "python3", env=home)
    assert r.returncode == 1 and "a kernel named 'python3' already exists" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "home" / ".local" / "share" / "jupyter" / "kernels" / "python3").exists()

    lookalike = kernels / "lookalike"  # metadata that merely mentions the package is not ours
    lookalike.mkdir()
    (lookalike / "kernel.json").write_text(json.dumps({"argv": ["x"], "display_name": "x", "language": "python",
                                                       "metadata": "made by hand, not tms_autopreload"}))
    (lookalike / "data").write_text("keep")
    r = kernel(scn, "install", "--prefix", str(tmp_path), "--name", "lookalike")
    assert r.returncode == 1 and (lookalike / "data").exists(), r.stdout + r.stderr

    for _ in range(2):  # our own: written, then replaced
        r = kernel(scn, "install", "--prefix", str(tmp_path), "--name", "ours", "--display-name", "Ours")
        assert r.returncode == 0, r.stderr
    assert json.loads((kernels / "ours" / "kernel.json").read_text())["display_name"] == "Ours"


def test_kernel_install_is_readable_by_everyone(real_torch, tmp_path):
    """Directory 0755 and kernel.json 0644, as ipykernel's installer leaves them, whatever the umask."""
    scn = real_torch(("driver",))
    r = scn.host.run(["sh", "-c", 'umask 077 && exec "$@"', "sh", str(scn.venv.python), "-m", "tms_autopreload",
                      "kernel", "install", "--prefix", str(tmp_path)], clean_env())
    assert r.returncode == 0, r.stderr
    where = tmp_path / "share" / "jupyter" / "kernels" / "python3-tms-autopreload"
    assert stat.S_IMODE(where.stat().st_mode) == 0o755
    assert stat.S_IMODE((where / "kernel.json").stat().st_mode) == 0o644


@pytest.mark.parametrize("name", ["", "a b", "../escape", "caf\u00e9", "x/y", ".", "..", "x\n", "a" * 256])
def test_kernel_names_are_checked_as_jupyter_checks_them(real_torch, tmp_path, name):
    scn = real_torch(("driver",))
    for action in ("install", "uninstall"):
        r = kernel(scn, action, "--prefix", str(tmp_path), "--name", name)
        refused_as_usage(r, "is not a kernel name Jupyter accepts. Fix: choose a name of ASCII letters")
    assert not (tmp_path / "share").exists()


# Names jupyter_client's pattern lets through that ours refuses, each for the reason its comment gives:
# directories that are not a kernel's own, a trailing newline, and non-ASCII letters that fold into a-z.
JUPYTER_ONLY = [".", "..", "a" * 256, "x\n", "\u0130", "\u0131", "\u017f", "\u212a", "k\u212a"]
NAMES = ["python3", "python3-tms-autopreload", "Py_3.11", "-", "_", "a.b-c_d", "A" * 255, "", " ", "a b", "x/y",
         "../x", "caf\u00e9", "x\ny", "\nx", "x\t", "\x00", "a+b", "a:b", "\uff41", "\u0661", *JUPYTER_ONLY]


def test_our_kernel_name_rule_agrees_with_jupyter_clients(real_torch):
    """kernelspec writes jupyter_client's private rule out (its comment names the version checked): here the
    real jupyter_client of the kernel tests judges the same names, and the two differ only on
    :data:`JUPYTER_ONLY`, all refused by ours. A jupyter_client that changes its rule fails this test."""
    scn = real_torch(("driver",))
    code = ("import json, sys\nfrom jupyter_client.kernelspec import _is_valid_kernel_name as theirs\n"
            "from tms_autopreload.commands.kernelspec import _is_valid_kernel_name as ours\n"
            "print(json.dumps([[bool(theirs(n)), ours(n)] for n in json.loads(sys.argv[1])]))")
    r = scn.run(["-c", code, json.dumps(NAMES)])
    assert r.returncode == 0, r.stderr
    verdicts = dict(zip(NAMES, map(tuple, json.loads(r.stdout)), strict=True))
    assert {n for n, (theirs, ours) in verdicts.items() if theirs != ours} == set(JUPYTER_ONLY), verdicts
    assert all(verdicts[n] == (True, False) for n in JUPYTER_ONLY), verdicts
    assert verdicts["python3-tms-autopreload"] == (True, True) and verdicts["a b"] == (False, False)


def test_kernel_empty_prefix_is_refused(real_torch, tmp_path):
    """``--prefix ""`` once meant "system-wide"; the system directories are hidden behind a tmpfs here, so
    that even the old behaviour could not write outside this test."""
    scn = real_torch(("driver",))
    argv = [str(scn.venv.python), "-m", "tms_autopreload", "kernel", "install", "--prefix", ""]
    r = scn.host.run(argv, clean_env(), setup="mount -t tmpfs tmpfs /usr/local/share")
    refused_as_usage(r, "--prefix: give a directory")


# Run in the host's namespace, where a tmpfs hides the system's /usr/local/share: `kernel install --help`, then
# install and uninstall without a location option, each folder under the roots given as they are after each step.
WITHOUT_LOCATION = """
import json, os, subprocess, sys
def kernel(*args):
    r = subprocess.run([sys.executable, "-m", "tms_autopreload", "kernel", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout
def tree():
    return sorted(os.path.join(d, n) for root in sys.argv[1:] for d, ds, fs in os.walk(root) for n in ds + fs)
out = {"help": " ".join(kernel("install", "--help").split()), "installed": kernel("install")}
out["after_install"] = tree()
kernel("uninstall")
out["after_uninstall"] = tree()
print(json.dumps(out))
"""


@pytest.mark.parametrize("platform_dirs", [False, True])
def test_kernel_install_help_says_where_it_goes_without_a_location_and_uninstall_removes_what_it_made(
        real_torch, tmp_path, platform_dirs):
    """Without --user, --sys-prefix or --prefix a kernel goes where jupyter_client puts it: its system-wide
    folder, /usr/local/share/jupyter/kernels here, or under ``JUPYTER_PLATFORM_DIRS=1`` the first of
    ``XDG_DATA_DIRS`` (a folder someone else made). ``--help`` names the folder that install then writes to, as
    jupyter_client computes it; uninstall removes the kernels and Jupyter folders that install made, and
    nothing it did not make. The system's folders are a tmpfs here: nothing outside this test is written."""
    scn = real_torch(("driver",))
    driver, xdg = tmp_path / "driver.py", tmp_path / "xdg"
    driver.write_text(WITHOUT_LOCATION)
    xdg.mkdir()
    env = clean_env(JUPYTER_PLATFORM_DIRS="1", XDG_DATA_DIRS=f"{xdg}:/usr/share") if platform_dirs else clean_env()
    root = xdg if platform_dirs else "/usr/local/share"
    r = scn.host.run([str(scn.venv.python), str(driver), str(root)], env, setup="mount -t tmpfs tmpfs /usr/local/share")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    kernels = f"{root}/jupyter/kernels"
    assert (f"Without --user, --sys-prefix or --prefix: jupyter_client's system-wide kernels folder ({kernels})"
            in out["help"]), out["help"]
    assert out["installed"].endswith(f" in {kernels}/python3-tms-autopreload\n"), out["installed"]
    made = [f"{root}/jupyter", kernels, f"{kernels}/python3-tms-autopreload"]
    assert out["after_install"] == [*made, f"{kernels}/python3-tms-autopreload/kernel.json"], out
    assert out["after_uninstall"] == [], out  # the root itself (the tmpfs, or XDG's folder) stays


def test_kernel_uninstall_removes_only_the_empty_folders_its_install_made(real_torch, tmp_path):
    """A new prefix: install makes PREFIX/share/jupyter/kernels; the last of this command's kernels there to be
    uninstalled takes the kernels and Jupyter folders with it (a kernel installed beside it, or the same one
    installed again, passes the record on), never PREFIX/share. A Jupyter folder someone else made stays, and
    so does one that holds someone's file; a record that claims folders higher up removes nothing above the
    Jupyter folder."""
    scn = real_torch(("driver",))

    def run(action, prefix, *args):
        r = kernel(scn, action, "--prefix", str(prefix), *args)
        assert r.returncode == 0, r.stderr

    def jupyter(prefix):
        return prefix / "share" / "jupyter"

    new = tmp_path / "new"
    run("install", new)
    run("install", new, "--name", "beside")
    run("install", new)  # the same kernel again
    run("uninstall", new)
    assert sorted(p.name for p in (jupyter(new) / "kernels").iterdir()) == ["beside"]
    run("uninstall", new, "--name", "beside")
    assert (new / "share").is_dir() and not jupyter(new).exists()

    theirs = tmp_path / "theirs"  # the Jupyter folder is someone else's: only the kernels folder was made
    jupyter(theirs).mkdir(parents=True)
    run("install", theirs)
    run("uninstall", theirs)
    assert jupyter(theirs).is_dir() and not (jupyter(theirs) / "kernels").exists()

    kept = tmp_path / "kept"  # made by install, then given a file by someone: it stays, with the file
    run("install", kept)
    (jupyter(kept) / "README").write_text("mine")
    run("uninstall", kept)
    assert (jupyter(kept) / "README").read_text() == "mine" and not (jupyter(kept) / "kernels").exists()

    forged = tmp_path / "forged"  # a record naming every folder up to the prefix, edited by hand
    run("install", forged)
    spec_file = jupyter(forged) / "kernels" / "python3-tms-autopreload" / "kernel.json"
    spec = json.loads(spec_file.read_text())
    spec["metadata"]["tms_autopreload"]["made"] += [str(forged / "share"), str(forged)]
    spec_file.write_text(json.dumps(spec))
    run("uninstall", forged)
    assert (forged / "share").is_dir() and not jupyter(forged).exists()


@pytest.mark.parametrize("env", ["TMS_AUTOPRELOAD=0", "TMS_AUTOPRELOAD=maybe", "TMS_AUTOPRELOAD_DISABLE=1"])
def test_kernel_env_that_turns_the_hook_off_is_refused(real_torch, tmp_path, env):
    scn = real_torch(("driver",))
    r = kernel(scn, "install", "--prefix", str(tmp_path), "--env", env)
    refused_as_usage(r, f"--env {env} turns off the hook this kernel exists for")
    assert not (tmp_path / "share").exists()


def test_kernel_env_that_keeps_the_hook_on_is_accepted(real_torch, tmp_path):
    scn = real_torch(("driver",))
    r = kernel(scn, "install", "--prefix", str(tmp_path), "--env", "SLIME_OFFLOAD_TRAIN=1", "--env",
               "TMS_AUTOPRELOAD_DISABLE=0")
    assert r.returncode == 0, r.stderr



# What ``kernel`` asks of jupyter_client, as jupyter_client 8.10.0 answers it for --prefix and --user (the kernel's
# folder under PREFIX/share/jupyter/kernels, or the user's; its files copied there, an earlier one replaced), for the
# fast lane; the real one, with its system folder and its search for kernels, in the tests above. ipykernel is an
# empty package beside it where ``with_ipykernel``.
JUPYTER_STANDIN = {
    "jupyter_client/__init__.py": "",
    "jupyter_client/kernelspec.py":
        "import os, shutil\n\n\nclass KernelSpecManager:\n"
        "    def _get_destination_dir(self, kernel_name, user=False, prefix=None):\n"
        "        base = (os.path.expanduser('~/.local/share/jupyter') if user else\n"
        "                os.path.join(os.path.abspath(prefix), 'share', 'jupyter') if prefix else\n"
        "                '/usr/local/share/jupyter')\n"
        "        return os.path.join(base, 'kernels', kernel_name.lower())\n\n"
        "    def find_kernel_specs(self):\n        return {}\n\n"
        "    def install_kernel_spec(self, source_dir, kernel_name=None, user=False, replace=None, prefix=None):\n"
        "        destination = self._get_destination_dir(kernel_name, user=user, prefix=prefix)\n"
        "        if os.path.isdir(destination):\n            shutil.rmtree(destination)\n"
        "        shutil.copytree(source_dir, destination)\n        return destination\n",
}


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory):
    """``jupyter(with_ipykernel)``: the PYTHONPATH that gives a process the Jupyter stand-in."""
    made = {}
    for with_ipykernel in (False, True):
        root = tmp_path_factory.mktemp("jupyter-standin")
        for name, text in {**JUPYTER_STANDIN, **({"ipykernel/__init__.py": ""} if with_ipykernel else {})}.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        made[with_ipykernel] = str(root)
    return made.__getitem__


def test_kernel_faults_each_say_their_cause(scenario, jupyter, tmp_path):
    """What ``kernel`` meets where it installs and removes kernels, each said with its exit code: a name Jupyter
    refuses (2), ipykernel missing (2), no kernel to remove (1), a kernel.json in the way that is not JSON (1, never
    replaced); and what its install made, removed only where it can be (a prefix moved since, a kernels folder it
    cannot list, a folder that holds someone's file), the kernel itself always."""
    from support import NO_DAC

    scn = report_host(scenario)
    env = {"PYTHONPATH": jupyter(True), "HOME": str(tmp_path)}

    def run(*args, prefix=None, env=env, prefix_argv=()):
        argv = [*prefix_argv, str(scn.venv.python), "-m", "tms_autopreload", "kernel", *args,
                *(["--prefix", str(prefix)] if prefix else [])]
        return scn.host.run(argv, clean_env(**env))

    refused_as_usage(run("install", "--name", "a b", prefix=tmp_path / "p"),
                     "is not a kernel name Jupyter accepts")
    r = run("install", prefix=tmp_path / "p", env={**env, "PYTHONPATH": jupyter(False)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("tms-autopreload kernel: ipykernel is not installed for "), r.stderr
    r = run("uninstall", prefix=tmp_path / "p")
    assert r.returncode == 1 and "no kernel named 'python3-tms-autopreload' in " in r.stderr, r.stderr
    broken = tmp_path / "broken" / "share" / "jupyter" / "kernels" / "python3-tms-autopreload"
    broken.mkdir(parents=True)
    (broken / "kernel.json").write_text("{not json")
    r = run("install", prefix=tmp_path / "broken")
    assert r.returncode == 1 and f"{broken} was not installed by tms-autopreload" in r.stderr, r.stderr
    assert (broken / "kernel.json").read_text() == "{not json"

    # A prefix moved after the install: the folders its record names are gone, so none here is proven made.
    assert run("install", prefix=tmp_path / "before").returncode == 0
    (tmp_path / "before").rename(tmp_path / "moved")
    assert run("uninstall", prefix=tmp_path / "moved").returncode == 0
    assert [p.name for p in (tmp_path / "moved" / "share" / "jupyter").iterdir()] == ["kernels"]
    # A kernels folder that can be entered, not listed (root without its permission bypass): nothing recorded as made.
    kernels = tmp_path / "unlisted" / "share" / "jupyter" / "kernels"
    kernels.mkdir(parents=True)
    kernels.chmod(0o311)
    r = run("install", prefix=tmp_path / "unlisted", prefix_argv=NO_DAC)
    assert r.returncode == 0, r.stderr
    spec = json.loads((kernels / "python3-tms-autopreload" / "kernel.json").read_text())
    assert spec["metadata"]["tms_autopreload"]["made"] == [], spec
    # Made by install, then given someone's file: uninstall removes the kernel, the folder stays, with the file.
    assert run("install", prefix=tmp_path / "kept").returncode == 0
    (tmp_path / "kept" / "share" / "jupyter" / "kernels" / "README").write_text("mine")
    assert run("uninstall", prefix=tmp_path / "kept").returncode == 0
    assert [p.name for p in (tmp_path / "kept" / "share" / "jupyter" / "kernels").iterdir()] == ["README"]

# ---------------------------------------------------------------- configure_subprocess() and start methods

STARTS = MAPPED + r'''
import concurrent.futures as cf, json, multiprocessing as mp, os, sys, warnings


def report(tag):
    return {'tag': tag, 'pid': os.getpid(), 'hooked': bool(mapped('torch_memory_saver'))}


def child(q, tag):
    q.put(report(tag))


if __name__ == '__main__':
    from tms_autopreload import configure_subprocess
    method = sys.argv[1]
    mp.set_start_method(method)  # on Linux before 3.14 the default is fork; 3.14 makes it forkserver
    out = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with configure_subprocess():
            q = mp.Queue()
            p = mp.Process(target=child, args=(q, 'Process'))
            p.start()
            out.append(q.get(timeout=120))
            p.join()
            with mp.Pool(1) as pool:
                out.append(pool.apply(report, ('Pool',)))
            with cf.ProcessPoolExecutor(1) as ex:
                out.append(ex.submit(report, 'ProcessPoolExecutor').result(timeout=120))
    print(json.dumps({'children': out, 'warnings': [str(w.message) for w in caught]}))
'''


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("python", ["3.11", "3.13"])
def test_configure_subprocess_under_each_start_method(scenario, tmp_path, python, method):
    """spawn and forkserver children start hooked. fork children are copies of the unhooked parent
    (fork does not exec, so the loader never reads LD_PRELOAD): the block warns up front, and each such
    child says, itself, on stderr, that it is not hooked and why. 3.13 stands for a Python whose default
    is forkserver (3.14) by setting it with ``set_start_method``."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",), python=python)
    script = tmp_path / "starts.py"
    script.write_text(STARTS)
    r = scn.run([str(script), method], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert [c["tag"] for c in out["children"]] == ["Process", "Pool", "ProcessPoolExecutor"]
    said = [line for line in r.stderr.splitlines() if "forked inside configure_subprocess()" in line]
    warned = [w for w in out["warnings"] if "start method is 'fork'" in w]
    if method == "fork":
        assert not any(c["hooked"] for c in out["children"]), out
        assert len(warned) == 1 and "use 'spawn' or 'forkserver'" in warned[0], out["warnings"]
        for c in out["children"]:  # each fork child said it in its own words, with its own PID
            mine = [line for line in said if f"process {c['pid']} " in line]
            assert len(mine) == 1, (c, r.stderr)
            assert "is not hooked" in mine[0] and "fork does not exec" in mine[0], mine
            assert "'spawn' or 'forkserver'" in mine[0], mine
    else:
        assert all(c["hooked"] for c in out["children"]), out
        assert not warned and not said, r.stderr


def test_fork_children_of_a_hooked_parent_are_hooked_and_nothing_warns(scenario, tmp_path):
    """A flagged parent maps the plan's hook itself: its fork children are copies of a hooked process, so
    neither the block nor the children say they are not hooked."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    script = tmp_path / "starts.py"
    script.write_text(STARTS)
    r = scn.run([str(script), "fork"], {"TMS_AUTOPRELOAD": "1"}, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(c["hooked"] for c in out["children"]), out
    assert not [w for w in out["warnings"] if "start method is 'fork'" in w], out["warnings"]
    assert "forked inside configure_subprocess()" not in r.stderr, r.stderr


def test_a_block_leaves_the_start_method_for_the_program_to_choose(scenario):
    """The block reads multiprocessing's start method without fixing it: a program that chooses its start
    method after a block (here in an unhooked process, where the block asks it) still can."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    code = ("import multiprocessing, tms_autopreload\n"
            "with tms_autopreload.configure_subprocess():\n    pass\n"
            "multiprocessing.set_start_method('spawn')\nprint(multiprocessing.get_start_method())")
    r = scn.run(["-c", code])
    assert r.returncode == 0 and r.stdout == "spawn\n", r.stderr


def test_fork_outside_a_block_says_nothing(scenario):
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    code = ("import multiprocessing, os, tms_autopreload.subprocesses\n"
            "multiprocessing.set_start_method('spawn')\n"
            "with tms_autopreload.configure_subprocess():\n    pass\n"
            "pid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('done')")
    r = scn.run(["-c", code])
    assert r.returncode == 0 and r.stdout == "done\n" and r.stderr == "", r.stderr


# ---------------------------------------------------------------- doctor --deep

SLEEPER = '''
import os, time
with open(os.environ["DEEP_READY"] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {os.getpgid(0)}")
os.rename(os.environ["DEEP_READY"] + ".tmp", os.environ["DEEP_READY"])
time.sleep(600)
'''


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)],
                         ids=["TERM", "INT", "HUP"])
def test_deep_cleans_up_when_interrupted(scenario, tmp_path, sig, code):
    """The signal comes once the child has started importing (it writes a marker): the binding log is
    deleted, the child's process group ended, and the exit is 128+N with one line, no traceback."""
    scn = report_host(scenario)
    mods, tmp = tmp_path / "mods", tmp_path / "tmp"
    mods.mkdir()
    tmp.mkdir()
    (mods / "tms_test_sleeper.py").write_text(SLEEPER)
    ready = tmp_path / "ready"
    env = clean_env(PYTHONPATH=str(mods), TMPDIR=str(tmp), DEEP_READY=str(ready))
    argv = [str(scn.venv.python), "-m", "tms_autopreload", "doctor", "--deep", "--import", "tms_test_sleeper"]
    # As from a terminal: the signal's default action, whatever this runner inherited (a job a shell without
    # job control starts in the background ignores SIGINT, and doctor rightly keeps an ignored signal ignored).
    p = subprocess.Popen(scn.host.wrap(argv, env), env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    child = None
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
        child, group = map(int, ready.read_text().split())
        assert group != p.pid  # the child leads a process group of its own
        assert [d.name for d in tmp.iterdir() if d.name.startswith("tms-autopreload-deep-")]
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        assert p.returncode == code, (p.returncode, out, err)
        assert "Traceback" not in err and err.count("\n") == 1, err
        assert f"interrupted by {sig.name}" in err and "binding log deleted" in err, err
        assert list(tmp.iterdir()) == [], list(tmp.iterdir())
        assert not alive(child)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if child is not None and alive(child):  # only on failure: the child this test started
            os.kill(child, signal.SIGKILL)



def test_deep_ends_an_import_that_never_finishes_at_its_timeout(scenario, tmp_path, monkeypatch):
    """The module ``doctor --deep`` imports never finishes (it waits forever): at the check's timeout the
    evidence says so, the child's process group is ended and the binding log deleted."""
    import tempfile

    from tms_autopreload.commands.doctor.deep import check

    scn = report_host(scenario)
    mods, tmp = tmp_path / "mods", tmp_path / "tmp"
    mods.mkdir()
    tmp.mkdir()
    (mods / "tms_test_sleeper.py").write_text(SLEEPER)
    ready = tmp_path / "ready"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    environ = clean_env(PYTHONPATH=str(mods), DEEP_READY=str(ready))
    ev = check(environ, str(scn.site / CU13), str(scn.parts.rt[13] / "libcudart.so.13"), module="tms_test_sleeper",
               executable=str(scn.venv.python), timeout=5)
    assert ev.error == "`import tms_test_sleeper` did not finish within 5 s" and not ev.ok, ev.error
    child, _group = map(int, ready.read_text().split())
    assert not alive(child) and list(tmp.iterdir()) == [], list(tmp.iterdir())


def test_deep_where_proc_is_not_mounted_proves_nothing_and_says_why(scenario):
    """``/proc`` replaced by an empty tmpfs: the child cannot read what it maps, nor the environment it started
    with; doctor --deep says that it cannot tell, never that the hook or the runtime is not mapped; exit 1."""
    scn = report_host(scenario)
    r = scn.host.run([str(scn.venv.python), "-m", "tms_autopreload", "doctor", "--deep", "--json", "--import", "json"],
                     clean_env(), setup="mount -t tmpfs none /proc")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["ok"] is False, r.stdout + r.stderr
    assert doc["error"] == ("the child could not read /proc/self/maps (is /proc mounted?), so what it maps after "
                            "`import json` is unknown"), doc


def test_deep_tells_a_failed_import_from_an_unmapped_hook(scenario):
    scn = report_host(scenario)
    r = cli(scn, "doctor", "--deep", "--import", "nonexistent_module")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "NOT mapped" not in r.stdout, r.stdout
    assert "import:   FAILED: ModuleNotFoundError: No module named 'nonexistent_module'" in r.stdout, r.stdout
    assert f"hook:     {scn.site / CU13} (mapped)" in r.stdout, r.stdout
    doc = json.loads(cli(scn, "doctor", "--deep", "--json", "--import", "nonexistent_module").stdout)
    assert doc["ok"] is False and doc["hook_mapped"] is True
    assert doc["import_error"] == "ModuleNotFoundError: No module named 'nonexistent_module'"


DEEP_KEYS = {"ok", "module", "hook", "hook_mapped", "runtime_library", "interposed", "runtime_libraries_mapped",
             "runtime_bound_by", "idle_runtimes", "hook_bound_to", "libraries", "import_error", "log_bytes", "seconds",
             "verdict", "cause", "fix", "error"}


def test_deep_json_has_its_documented_keys_with_and_without_a_plan(scenario):
    reference = (ROOT / "docs" / "reference.md").read_text()
    documented = reference.split("`--json` keys: ", 1)[1].split("\n\n", 1)[0]
    for key in DEEP_KEYS:
        assert f"`{key}`" in documented, key
    no_driver = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("cuda13",))
    r = cli(no_driver, "doctor", "--deep", "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == DEEP_KEYS and doc["ok"] is False and "libcuda.so.1" in doc["error"], doc
    assert doc["verdict"] == f"NOT PROVEN: {doc['error']}"
    doc = json.loads(cli(report_host(scenario), "doctor", "--deep", "--json", "--import", "json").stdout)
    assert set(doc) == DEEP_KEYS, doc



def _evidence(runtimes=("/x/nvidia/cu13/lib/libcudart.so.13",), **fields):
    from tms_autopreload.commands.doctor.deep import Evidence

    ev = Evidence("torch", "/x/hook_cu13.so", runtimes[0], ("cudaMalloc", "cudaFree"))
    ev.hook_mapped, ev.runtimes = True, list(runtimes)
    for name, value in fields.items():
        setattr(ev, name, value)
    return ev


def _library(path, status, reason, **bound):
    from tms_autopreload.commands.doctor.deep import Library

    lib = Library(path)
    lib.bound, lib.status, lib.reason = bound, status, reason
    return lib


def test_deep_report_names_where_each_reference_went_and_a_cause_only_with_its_fix():
    """The text of ``doctor --deep``, rendered from the evidence: a bypassed library names the object its
    references were bound to, an unbound one says "nothing"; no cause line where nothing is wrong; where
    two runtime copies take bindings, the verdict says so and the cause line carries its fix."""
    runtime = "/x/nvidia/cu13/lib/libcudart.so.13"
    good = _library("/x/torch/lib/libc10_cuda.so", "intercepted", "every reference binds to the hook",
                    cudaMalloc="/x/hook_cu13.so", cudaFree="/x/hook_cu13.so")
    bypassed = _library("/x/lib/libstatic.so", "bypassed", "bound to it", cudaMalloc="/x/lib/libstatic.so")
    unbound = _library("/x/lib/libweak.so", "unbound", "left unresolved", cudaFree=None)
    ev = _evidence(libraries=[good, bypassed, unbound], bound_by={runtime: ["/x/torch/lib/libc10_cuda.so"]})
    assert ev.ok is False and ev.cause is None and ev.verdict() == \
        "BYPASSED: 2 of 3 libraries do not reach the hook"
    lines = ev.text("the plan").splitlines()
    assert "torch's CUDA allocator (libc10_cuda.so): cudaMalloc, cudaFree -> hook" in lines, lines
    assert "libstatic.so: cudaMalloc -> libstatic.so (BYPASSED: bound to it)" in lines, lines
    assert "libweak.so: cudaFree -> nothing (UNBOUND: left unresolved)" in lines, lines
    assert lines[-1] == "verdict:  BYPASSED: 2 of 3 libraries do not reach the hook", lines
    assert not [line for line in lines if line.startswith("cause:")], lines

    ok = _evidence(libraries=[good], bound_by={runtime: ["/x/torch/lib/libc10_cuda.so"]})
    assert ok.ok and ok.text("the plan").splitlines()[-1] == (
        "verdict:  INTERCEPTED: every reference (1 libraries, 2 bindings) binds to the hook; one runtime library "
        "mapped")

    other = "/usr/local/cuda/lib64/libcudart.so.13"
    two = _evidence((runtime, other), libraries=[good],
                    bound_by={runtime: ["/x/torch/lib/libc10_cuda.so"], other: ["/x/lib/libnccl.so.2"]})
    head = (f"NOT PROVEN: 2 runtime libraries are mapped after `import torch` ({runtime} (bound by 1 object), "
            f"{other} (bound by 1 object)): ")
    assert two.verdict() == head + ("so allocations the hook forwards and the rest of the module's CUDA calls can "
                                    "land in different runtimes; expected exactly one that takes bindings")
    assert two.text("the plan").splitlines()[-1] == (
        "cause:    second-runtime-bound; fix: run `tms-autopreload doctor`: it names what each copy is and why it "
        "is chosen")
    elsewhere = _evidence((runtime, other), libraries=[good], bound_by={runtime: [], other: ["/x/a.so", "/x/b.so"]})
    assert elsewhere.verdict() == (
        f"NOT PROVEN: 2 runtime libraries are mapped after `import torch` ({runtime} (bound by 0 objects), {other} "
        f"(bound by 2 objects)): so the calls land in {other}, not in {runtime}, the copy the plan binds for "
        f"torch; expected that one alone to take bindings")


def test_deep_without_a_library_that_references_the_symbols_proves_nothing():
    ev = _evidence(bound_by={"/x/nvidia/cu13/lib/libcudart.so.13": []})
    assert not ev.ok and ev.verdict() == "NOT PROVEN: no library loaded by `import torch` references cudaMalloc, " \
                                         "cudaFree"


def test_deep_as_is_checks_the_build_its_preload_names_else_the_plans():
    """``doctor --deep --as-is``: the hook to look for is the torch_memory_saver build the environment's
    LD_PRELOAD names by an absolute path; without one (none, or a bare name), the plan's."""
    from tms_autopreload.commands.doctor.deep import under_test
    from tms_autopreload.verdict import Plan

    planned = "/site/torch_memory_saver_hook_mode_preload_cu13.abi3.so"
    plan = Plan(planned, planned, None, None)
    own = "/opt/torch_memory_saver_hook_mode_preload_cu12.abi3.so"
    for preload, hook in ((f"/x/libfoo.so:{own}", own), ("", planned), ("/x/libfoo.so", planned),
                          ("torch_memory_saver_hook_mode_preload_cu12.abi3.so", planned)):
        environ = {"LD_PRELOAD": preload, "HOME": "/root"}
        assert under_test(plan, as_is=True, environ=environ) == (environ, hook, "this environment as it is"), preload


def test_deep_finds_unbound_references_past_a_mapped_file_that_is_no_elf_object(tmp_path):
    """A process maps files that are no ELF object (the locale archive, a cache): the search for
    references the log never bound reads every mapped object past them."""
    from tms_autopreload.commands.doctor.deep import _unbound
    from support import cc

    runtime = cc(tmp_path / "rt" / "libcudart.so.13", "int cudaMalloc(void **p, unsigned long n) { return 0; }\n",
                 "-Wl,-soname,libcudart.so.13")
    user = cc(tmp_path / "libuser.so", "extern int cudaMalloc(void **p, unsigned long n);\n"
              "int use(void) { void *p; return cudaMalloc(&p, 1); }\n",
              f"-L{runtime.parent}", "-l:libcudart.so.13")
    archive = tmp_path / "locale-archive"
    archive.write_bytes(b"not an ELF object\n" * 64)
    ev = _evidence((str(runtime),))
    libraries = {}
    _unbound([str(archive), str(user)], "libcudart.so.13", frozenset({"cudaMalloc", "cudaFree"}), libraries, ev)
    assert list(libraries) == [str(user)] and libraries[str(user)].bound == {"cudaMalloc": None}


def test_a_truncated_runtime_first_on_ld_library_path_rejects_the_build_it_would_serve(scenario, parts, tmp_path):
    """A copy of libcudart.so.13 cut short (its ELF header whole, its dynamic section gone) first on the user's
    LD_LIBRARY_PATH: the loader model finds it first and the real loader fails on it, so the CUDA 13 build is
    rejected as one that does not load; the start stops with the builds and their reasons, exit 78, never with
    the internal error of a read that failed."""
    scn = report_host(scenario)
    cut = tmp_path / "lib"
    cut.mkdir()
    (cut / "libcudart.so.13").write_bytes((parts.rt[13] / "libcudart.so.13").read_bytes()[:2048])
    r = scn.flagged("print('user code ran')", {"LD_LIBRARY_PATH": str(cut)})
    assert r.returncode == 78 and r.stdout == "" and "Traceback" not in r.stderr, (r.returncode, r.stdout, r.stderr)
    assert "internal error" not in r.stderr and "no torch_memory_saver preload build fits CUDA 13" in r.stderr, r.stderr
    doc = scn.doctor({"LD_LIBRARY_PATH": str(cut)})
    cu13 = next(c for c in doc["candidates"] if c["path"] == str(scn.site / CU13))
    assert (doc["cause"], cu13["status"], cu13["cause"]) == ("no-build-fits", "rejected", "does-not-load"), doc


# ---------------------------------------------------------------- LD_PRELOAD naming a runtime library

def test_a_preloaded_runtime_library_is_the_one_the_process_binds(scenario, parts, tmp_path):
    """``LD_PRELOAD=/usr/local/cuda-13.0/lib/libcudart.so.13``: the loader matches every later
    ``libcudart.so.13`` DT_NEEDED (torch's, the hook's) to that object by its SONAME, so it is the
    process's runtime library and the hook binds to it: one runtime copy, and doctor says so."""
    scn = report_host(scenario)
    lib = tmp_path / "cuda-13.0" / "lib"
    lib.mkdir(parents=True)
    copy = lib / "libcudart.so.13"
    copy.write_bytes((parts.rt[13] / "libcudart.so.13").read_bytes())
    env = {"LD_PRELOAD": str(copy)}
    r = cli(scn, "doctor", env=env)
    assert r.returncode == 0 and "would bind to None" not in r.stdout, r.stdout
    assert f"libcudart.so.13 -> {copy} (LD_PRELOAD)" in r.stdout, r.stdout
    doc = json.loads(cli(scn, "doctor", "--json", env=env).stdout)
    assert doc["runtime"]["library"] == str(copy) and doc["runtime"]["library_rule"] == "LD_PRELOAD"
    assert doc["plan"]["env"]["LD_PRELOAD"] == f"{scn.site / CU13}:{copy}", doc["plan"]
    code = MAPPED + "print(mapped('libcudart'))"
    r = scn.run(["-c", code], {"TMS_AUTOPRELOAD": "1", **env})
    assert r.returncode == 0 and r.stdout.strip() == repr([str(copy)]), r.stdout + r.stderr
