#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU whose python3 already has a CUDA torch (CUDA 12 or 13).
#
#   scripts/gpu-check.sh             the check; exit 0 = all passed, 1 = a check failed, 2 = no GPU, no CUDA
#                                    torch or no wheels here (said clearly on stderr): nothing was checked
#   scripts/gpu-check.sh --fetch     put what it installs into scripts/wheels/, where pip reaches the index;
#                                    with TMS_EXAMPLES=DIR, torch_memory_saver's test/examples too
#   scripts/gpu-check.sh --dry-run   every step up to the GPU and none on it (a machine without one); exit 2
#                                    when all of them passed, 1 when one failed
#   scripts/gpu-check.sh --venv DIR  only the venvs, DIR/<version>, one per torch_memory_saver version
#   scripts/gpu-check.sh --their-tests DIR   only torch_memory_saver's tests, put together at DIR, and
#                                    which of their files run (exit 1: a file neither run nor listed)
#   TMS_EXAMPLES=DIR                 torch_memory_saver's test/examples at the commit its 0.0.10 sdist was
#                                    made from (docs/gpu.md): without it their GPU tests do not run
#
# The GPU machine may have no network: what it installs comes from scripts/wheels/ (WHEELS names another
# directory): torch_memory_saver 0.0.10 and 0.0.9.post1, this package's wheel, pytest with what it needs, and
# torch_memory_saver 0.0.10's sdist. torch is python3's own (PYTHON names another interpreter). For each
# version, a venv that sees that torch; in it, in exec and in dlopen mode (TMS_AUTOPRELOAD_MODE), one table:
# `tms-autopreload doctor --deep` (where the loader binds torch's cudaMalloc/cudaFree), then a process
# started only with SLIME_OFFLOAD_TRAIN=1 (as slime's train worker: every allocation pauseable from the
# start, CPU backup on) that checks it runs doctor's plan, allocates 8 GiB, pause()s (the GPU's free memory
# must rise by >= 90% of it), resume()s (the contents must survive), then starts a spawn child that must
# inherit the plan without resolving again and pause and resume 2 GiB of its own. Then torch_memory_saver's
# own tests (the sdist's test/) in a process started with TMS_AUTOPRELOAD=1; a test that fails there runs
# again without the flag, as their CI runs it. Their GPU tests, test_examples.py, run only with the scenarios
# the sdist leaves out, test/examples/, which the user gives: TMS_EXAMPLES, else $WHEELS/examples, which
# --fetch copies from TMS_EXAMPLES; without them the check says that their GPU tests did not run. Every
# step runs under `timeout`, within GPU_CHECK_SECONDS in all (default 540); a step the time left cannot
# hold is not run, and fails the check. Logs stay in the work directory named at the end.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
wheels="${WHEELS:-$here/wheels}"
python="${PYTHON:-python3}"
versions=(0.0.10 0.0.9.post1)
suite_version=0.0.10  # the sdist whose tests run, in that version's venv
budget="${GPU_CHECK_SECONDS:-540}"

usage() { echo "usage:" >&2; sed -n '4,14s/^#//p' "$0" >&2; exit 2; }

# torch_memory_saver's test/examples/, the scenarios of their GPU tests: the user's (TMS_EXAMPLES), else the
# copy --fetch made of it; none, and their GPU tests do not run.
examples="${TMS_EXAMPLES:-}"
if [ -n "$examples" ] && [ ! -d "$examples" ]; then
  echo "gpu-check: TMS_EXAMPLES=$examples is not a directory: give torch_memory_saver's test/examples at the" \
       "commit its $suite_version sdist was made from (docs/gpu.md), or leave TMS_EXAMPLES unset" >&2
  exit 2
fi
if [ -z "$examples" ] && [ -d "$wheels/examples" ]; then examples="$wheels/examples"; fi

# What the steps install, by file name in $wheels: each version's wheel and this package's (the venvs); the
# sdist (their tests); pytest (in the venv of their version).
venv_files=()
for v in "${versions[@]}"; do venv_files+=("torch_memory_saver-$v-*.whl"); done
venv_files+=("tms_autopreload-*.whl")
sdist="torch_memory_saver-$suite_version.tar.gz"

# need_wheels PATTERN...: exactly one file in $wheels for each, or stop with exit 2 and what to do.
need_wheels() {
  local pattern missing=()
  for pattern in "$@"; do
    # shellcheck disable=SC2086 # the pattern is a glob on purpose
    [ "$(ls -1 "$wheels"/$pattern 2>/dev/null | wc -l)" = 1 ] || missing+=("$pattern")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "gpu-check: not exactly one of ${missing[*]} in $wheels: run 'scripts/gpu-check.sh --fetch' where pip" \
         "reaches the package index (and carry $wheels to this machine)" >&2
    exit 2
  fi
}

# One venv per version: it sees $python's own torch (--system-site-packages), as on an image whose
# interpreter carries torch, with that torch_memory_saver and this package installed in it.
make_venvs() {
  local v dir own
  need_wheels "${venv_files[@]}"
  for v in "${versions[@]}"; do
    dir="$1/$v"
    "$python" -m venv --system-site-packages "$dir"
    # --system-site-packages reaches only the base interpreter's site-packages. Where $python is itself a
    # venv (a GPU image's /opt/torch/.venv holds torch), a path line in the new venv names that venv's own.
    own="$("$python" -c 'import sys, sysconfig; print(sysconfig.get_paths()["purelib"] if sys.prefix != sys.base_prefix else "")')"
    if [ -n "$own" ]; then
      echo "$own" > "$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_gpu_check_outer_venv.pth"
    fi
    "$dir/bin/python" -m pip install -q --no-index --no-deps "$wheels"/torch_memory_saver-"$v"-*.whl \
      "$wheels"/tms_autopreload-*.whl
  done
}

# Their tests at DIR: the sdist's test/, with the user's examples/ beside it where given (the sdist leaves
# it out); then which files run.
their_tests() {
  need_wheels "$sdist"
  mkdir -p "$1"
  tar -xzf "$wheels/$sdist" -C "$1" --strip-components=2 \
    "torch_memory_saver-$suite_version/test"
  if [ -n "$examples" ]; then mkdir -p "$1/examples" && cp -R "$examples/." "$1/examples/"; fi
  "$python" "$here/gpu_check.py" select "$1"
}

case "${1:-}" in
  --fetch)
    mkdir -p "$wheels"
    for v in "${versions[@]}"; do
      "$python" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "torch-memory-saver==$v"
    done
    # pip prepares the metadata of the sdist it downloads, and its setup.py refuses to run without a CUDA major.
    TMS_CUDA_MAJOR=13 "$python" -m pip download -q --no-deps --no-binary=:all: -d "$wheels" \
      "torch-memory-saver==$suite_version"
    # The tests' own pytest, with what it needs on every CPython this package supports: pip evaluates the
    # markers for the interpreter it runs under, so the two that CPython 3.10 alone needs are named.
    "$python" -m pip download -q --only-binary=:all: --python-version 3.10 -d "$wheels" \
      "$(grep '^pytest==' "$here/../tests/requirements.txt")" exceptiongroup tomli
    # This package's wheel, built from a copy of what git does not ignore: in the tree itself setuptools
    # would leave a build/ there, and reuse one it finds, stale files and all.
    rm -f "$wheels"/tms_autopreload-*.whl
    root="$here/.."
    src="$(mktemp -d)"
    if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
      (cd "$root" && git ls-files -z --cached --others --exclude-standard \
        | tar --null --ignore-failed-read -T - -cf -) | tar -xf - -C "$src"
      root="$src"
    fi
    "$python" -m pip wheel -q --no-deps -w "$wheels" "$root"
    rm -rf "$src"
    # The user's examples, for a GPU machine that gets $wheels alone (a copy first: TMS_EXAMPLES may be it).
    if [ -n "${TMS_EXAMPLES:-}" ]; then
      rm -rf "$wheels/examples.new"
      cp -R "$TMS_EXAMPLES" "$wheels/examples.new"
      rm -rf "$wheels/examples"
      mv "$wheels/examples.new" "$wheels/examples"
    fi
    ls -1 "$wheels"
    # Which of their tests the GPU machine will run, with these.
    their="$(mktemp -d)"
    rc=0
    their_tests "$their" || rc=$?
    rm -rf "$their"
    exit "$rc" ;;
  --venv)
    make_venvs "${2:?usage: scripts/gpu-check.sh --venv DIR}"
    exit 0 ;;
  --their-tests)
    their_tests "${2:?usage: scripts/gpu-check.sh --their-tests DIR}"
    exit ;;
  --dry-run) dry=1 ;;
  "") dry=0 ;;
  *) usage ;;
esac

# Which torch the check runs with (the interpreter's own: a GPU image's, which may have no network), first,
# so that every run says it, a run on a machine without a GPU too; then the GPUs and their driver.
"$python" - <<'PY' || echo "gpu-check: $python cannot be run"
import sys
try:
    import torch
except Exception as exc:  # any failure to import is the answer
    print(f"gpu-check: {sys.executable}: no torch ({type(exc).__name__}: {exc})")
else:
    print(f"gpu-check: {sys.executable}: torch {torch.__version__} (CUDA {torch.version.cuda}) from {torch.__file__}")
PY
gpu=0
if [ "$dry" = 1 ]; then
  echo "gpu-check: dry run: every step up to the GPU, none on it"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu=1
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader \
    | sed 's/^/gpu-check: GPU (index, name, driver, memory): /'
else
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi missing or finds no device); nothing to check" \
       "('scripts/gpu-check.sh --dry-run' runs every step up to the GPU)" >&2
  exit 2
fi
# A CUDA 12 or 13 torch (the majors torch_memory_saver builds for) that sees the GPU; in a dry run, any.
cuda_torch='import sys, torch; major = (torch.version.cuda or "").split(".")[0]
sys.exit(0 if major in ("12", "13") and (sys.argv[1] == "0" or torch.cuda.is_available()) else 1)'
if ! "$python" -c "$cuda_torch" "$gpu" 2>/dev/null; then
  echo "gpu-check: $python has no CUDA 12 or 13 torch$([ "$gpu" = 1 ] && echo " that sees the GPU");" \
       "nothing to check" >&2
  exit 2
fi
need_wheels "${venv_files[@]}" "$sdist" "pytest-*.whl"

exec 3>&1  # a step's own words reach the terminal, whatever its output is redirected to
work="$(mktemp -d)"
deadline=$((SECONDS + budget))
failed=0
summary=()
on_gpu=()  # what tells the Python half that it may use the GPU
if [ "$gpu" = 1 ]; then on_gpu=(--gpu); fi

# judge NAME RC: one line of the summary; a step that did not exit 0 fails the check.
judge() {
  summary+=("$(printf '%-48s %s' "$1" "$([ "$2" = 0 ] && echo PASS || echo "FAIL (exit $2)")")")
  if [ "$2" != 0 ]; then failed=1; fi
}

# step CAP LOG CMD...: CMD under `timeout`, for at most CAP seconds and the budget's time left (15 s of it
# kept for the summary), its stderr appended to LOG. Returns CMD's status; 124 when it ran out of time.
step() {
  local cap=$1 log=$2 rc=0 left
  shift 2
  left=$((deadline - SECONDS - 15))
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt 10 ]; then
    echo "gpu-check: not run, the time is spent: ${*:1:4} ..." >&3
    return 124
  fi
  timeout -k 10 "$cap" "$@" 2>>"$log" || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then echo "gpu-check: ran out of time after $cap s: ${*:1:4} ..." >&3; fi
  return "$rc"
}

# tail_of LOG: the end of a failed step's log, indented, so that a run on a machine that goes away says why.
tail_of() { tail -n 15 "$1" 2>/dev/null | sed 's/^/    | /' >&3 || true; }

echo "gpu-check: venvs for torch_memory_saver ${versions[*]}"
rc=0
step 240 "$work/venvs.log" bash "$0" --venv "$work/venvs" || rc=$?
if [ "$rc" != 0 ]; then
  echo "gpu-check: the venvs could not be made (exit $rc)"; tail_of "$work/venvs.log"; exit 1
fi

# Their tests, and pytest in the venv of their version.
their="$work/their-tests"
suite_python="$work/venvs/$suite_version/bin/python"
rc=0
step 120 "$work/pytest.log" "$suite_python" -m pip install -q --no-index --find-links "$wheels" pytest || rc=$?
[ "$rc" = 0 ] || tail_of "$work/pytest.log"
their_tests "$their" || rc=$?
judge "their tests: pytest, the files" "$rc"

for v in "${versions[@]}"; do
  for mode in exec dlopen; do
    py="$work/venvs/$v/bin/python"
    echo
    echo "== torch_memory_saver $v, $mode mode =="
    deep="$work/deep-$v-$mode.json"
    step 150 "$work/deep-$v-$mode.log" "$py" -m tms_autopreload doctor --deep --mode "$mode" --json > "$deep" || true
    [ -s "$deep" ] || tail_of "$work/deep-$v-$mode.log"
    rc=0
    step 240 "$work/probe-$v-$mode.log" env SLIME_OFFLOAD_TRAIN=1 TMS_AUTOPRELOAD_MODE="$mode" \
      TMS_AUTOPRELOAD_VERBOSE=1 "$py" "$here/gpu_check.py" probe --deep "$deep" --mode "$mode" \
      --version "$v" "${on_gpu[@]}" \
      || rc=$?
    [ "$rc" = 0 ] || tail_of "$work/probe-$v-$mode.log"
    judge "torch_memory_saver $v, $mode mode" "$rc"
  done
done

echo
echo "== torch_memory_saver $suite_version's own tests (its sdist's test/), TMS_AUTOPRELOAD=1 =="
rc=0
cap=$((deadline - SECONDS - 15))
[ "$cap" -lt 330 ] || cap=330
# The runner ends its own pytest runs 20 s before the step's limit, so that it still prints its table.
step "$cap" "$work/suite.log" "$suite_python" "$here/gpu_check.py" suite --python "$suite_python" \
  --tests "$their" --out "$work" --seconds $((cap - 20)) "${on_gpu[@]}" || rc=$?
[ "$rc" = 0 ] || tail_of "$work/suite.log"
judge "their tests, flagged" "$rc"
# Without the user's examples their GPU tests do not run: a row of the summary, and the last words, say so.
if [ ! -d "$their/examples" ]; then
  summary+=("$(printf '%-48s %s' "their GPU tests (test_examples.py)" "NOT RUN (no test/examples: TMS_EXAMPLES)")")
fi

echo
echo "== summary: $SECONDS s; logs in $work =="
printf '%s\n' "${summary[@]}"
if [ "$failed" = 1 ]; then exit 1; fi
if [ ! -d "$their/examples" ]; then
  echo "gpu-check: torch_memory_saver's own GPU tests (test_examples.py) did not run: their scenarios," \
       "test/examples, are not in the sdist; give TMS_EXAMPLES=DIR (docs/gpu.md)" >&2
fi
if [ "$dry" = 1 ]; then
  echo "gpu-check: dry run: every step up to the GPU passed; nothing ran on a GPU" >&2
  exit 2
fi
