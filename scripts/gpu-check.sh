#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU whose python3 already has a CUDA 13 torch.
#
# Installs torch_memory_saver 0.0.9.post1 and tms_autopreload from wheels carried next to this
# script (scripts/wheels/, made by `scripts/gpu-check.sh --fetch` on a machine with the package
# index; the GPU machine may have no network) into a venv that sees the system torch. Then runs
# `tms-autopreload doctor --deep` (where the loader binds torch's cudaMalloc/cudaFree) and, in a
# process started only with SLIME_OFFLOAD_TRAIN=1 (as slime's train worker: every allocation pauseable
# from the start, CPU backup on): allocate 8 GiB, pause(), check that the GPU's free memory rose by >= 90% of that,
# resume(), and check that the tensor's contents survived. Prints first which torch it runs with (version
# and CUDA), then one table; exit 0 = all passed,
# 1 = a check failed, 2 = no GPU / no CUDA torch here (said clearly).
#
# `scripts/gpu-check.sh --venv DIR` builds only that venv, at DIR, and stops: the layout the check
# runs in, without a GPU (tests/test_sitepath.py starts it there). WHEELS names another wheel directory.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
wheels="${WHEELS:-$here/wheels}"
python="${PYTHON:-python3}"

# The venv the check runs in: it sees $python's own torch (--system-site-packages), as on an image
# whose interpreter carries torch, with torch_memory_saver and tms_autopreload installed in it.
make_venv() {
  ls "$wheels"/torch_memory_saver-0.0.9.post1-*.whl "$wheels"/tms_autopreload-*.whl >/dev/null || {
    echo "gpu-check: wheels missing in $wheels: run 'scripts/gpu-check.sh --fetch' where pip reaches the index" >&2; exit 2; }
  "$python" -m venv --system-site-packages "$1"
  # --system-site-packages reaches only the base interpreter's site-packages. Where $python is itself a
  # venv (a GPU image's /opt/torch/.venv holds torch), a path line in the new venv names that venv's own.
  own="$("$python" -c 'import sys, sysconfig; print(sysconfig.get_paths()["purelib"] if sys.prefix != sys.base_prefix else "")')"
  if [ -n "$own" ]; then
    echo "$own" > "$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_gpu_check_outer_venv.pth"
  fi
  "$1/bin/python" -m pip install -q --no-index --no-deps "$wheels"/torch_memory_saver-0.0.9.post1-*.whl "$wheels"/tms_autopreload-*.whl
}

if [ "${1:-}" = "--fetch" ]; then
  mkdir -p "$wheels"
  "$python" -m pip download -q --no-deps -d "$wheels" torch-memory-saver==0.0.9.post1
  "$python" -m pip wheel -q --no-deps -w "$wheels" "$here/.."
  ls -1 "$wheels"
  exit 0
fi

if [ "${1:-}" = "--venv" ]; then
  make_venv "${2:?usage: scripts/gpu-check.sh --venv DIR}"
  exit 0
fi

# Which torch the check runs with (the interpreter's own: a GPU image's, which may have no network), first,
# so that every run says it, a run on a machine without a GPU too.
"$python" - <<'PY' || echo "gpu-check: $python cannot be run"
import sys
try:
    import torch
except Exception as exc:  # any failure to import is the answer
    print(f"gpu-check: {sys.executable}: no torch ({type(exc).__name__}: {exc})")
else:
    print(f"gpu-check: {sys.executable}: torch {torch.__version__} (CUDA {torch.version.cuda}) from {torch.__file__}")
PY

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi missing or finds no device); nothing to check" >&2
  exit 2
fi
if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() and (torch.version.cuda or "").startswith("13") else 1)'; then
  echo "gpu-check: $python has no CUDA 13 torch that sees the GPU; nothing to check" >&2
  exit 2
fi
venv="$(mktemp -d)/venv"
make_venv "$venv"

# First the binding proof (no GPU needed): where the loader binds torch's allocator calls.
deep_json="$(mktemp)"
"$venv/bin/python" -m tms_autopreload doctor --deep --json > "$deep_json" || true

SLIME_OFFLOAD_TRAIN=1 TMS_AUTOPRELOAD_VERBOSE=1 DEEP_JSON="$deep_json" "$venv/bin/python" - <<'PY'
import json, os, sys, time
import torch
from torch_memory_saver import torch_memory_saver

GIB = 1 << 30
rows, ok = [], True
def check(name, passed, detail):
    global ok
    ok &= bool(passed)
    rows.append((name, "PASS" if passed else "FAIL", detail))

try:
    deep = json.load(open(os.environ["DEEP_JSON"]))
except (OSError, ValueError) as exc:
    deep = {"ok": False, "verdict": f"doctor --deep gave no report ({exc})"}
check("doctor --deep (binding proof)", deep.get("ok"), deep.get("verdict") or deep.get("error"))

maps = [l.split()[-1] for l in open("/proc/self/maps") if "torch_memory_saver" in l]
check("hook mapped", any(m.endswith("_cu13.abi3.so") for m in maps), sorted(set(maps))[0] if maps else "none")
cudart = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libcudart.so" in l})
check("one libcudart", len(cudart) == 1, ", ".join(cudart))
check("TMS_INIT_ENABLE_CPU_BACKUP", os.environ.get("TMS_INIT_ENABLE_CPU_BACKUP") == "1", os.environ.get("TMS_INIT_ENABLE_CPU_BACKUP"))
torch.cuda.init()
t0 = time.perf_counter()
# As slime's train worker: TMS_INIT_ENABLE=1 (set by the flag) makes every allocation pauseable from the
# start, with CPU backup from TMS_INIT_ENABLE_CPU_BACKUP=1, so no region() (which asserts none is active).
x = torch.arange(2 * GIB, dtype=torch.float32, device="cuda")  # 8 GiB
torch.cuda.synchronize()
expect = x[:: 1 << 20].clone()
free_before, total = torch.cuda.mem_get_info()
torch_memory_saver.pause()
torch.cuda.synchronize()
free_paused, _ = torch.cuda.mem_get_info()
rose = free_paused - free_before
check("pause frees >= 90% of 8 GiB", rose >= 0.9 * 8 * GIB, f"free +{rose / GIB:.2f} GiB")
torch_memory_saver.resume()
torch.cuda.synchronize()
same = torch.equal(x[:: 1 << 20], expect)
check("contents survive resume", same, f"{expect.numel()} sampled values compared")
check("time", True, f"{time.perf_counter() - t0:.1f} s for allocate/pause/resume")
print(f"{'check':32s} {'result':6s} detail")
for r in rows:
    print(f"{r[0]:32s} {r[1]:6s} {r[2]}")
print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  total {total / GIB:.0f} GiB")
sys.exit(0 if ok else 1)
PY
