#!/usr/bin/env bash
# GPU smoke test: on a machine with a real NVIDIA GPU and driver, run
# `gpu-node-installer verify --cuda-smoke` against the driver libraries already installed
# there (no install dir, nothing written) and print one line per GPU, then one line with
# the node agent's view (fabric, persistence), GPM readings, and MIG profiles vs the table.
#
#   scripts/gpu-smoke.sh [--lib-dir DIR] [--expect-gpus N] [--json FILE]
#
# --lib-dir      directory holding libnvidia-ml.so.1 and libcuda.so.1 (default: found via
#                the linker cache, then the usual driver locations)
# --expect-gpus  GPUs that must be seen (default: the NVIDIA GPUs on the PCI bus; pass the
#                number a container was given when it sees only some of the node's GPUs)
# --json FILE    also keep verify's full JSON report there
# PYTHON=...     interpreter with the installer's dependencies (default: .venv/bin/python)
# Exit status: verify's (0 ok, 12 verification failed; see docs/reference.md, "Exit codes").
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
lib_dir="" expect="" json_out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --lib-dir) lib_dir=${2:?--lib-dir needs a directory}; shift 2 ;;
    --lib-dir=*) lib_dir=${1#*=}; shift ;;
    --expect-gpus) expect=${2:?--expect-gpus needs a number}; shift 2 ;;
    --expect-gpus=*) expect=${1#*=}; shift ;;
    --json) json_out=${2:?--json needs a file}; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-smoke: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

has_both() { [ -e "$1/libnvidia-ml.so.1" ] && [ -e "$1/libcuda.so.1" ]; }

find_lib_dir() {
  local dir
  # 1. what the dynamic linker would load
  dir=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true) \
        | awk '/libnvidia-ml\.so\.1 .*(x86-64|AArch64)/ {print $NF; exit}')
  if [ -n "$dir" ] && has_both "$(dirname "$dir")"; then dirname "$dir"; return; fi
  # 2. where drivers usually are (distribution packages, runfile, GKE, containers)
  for dir in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib \
             /usr/lib/x86_64-linux-gnu/nvidia/current /usr/local/nvidia/lib64 \
             /home/kubernetes/bin/nvidia/lib64 /run/nvidia/driver/usr/lib/x86_64-linux-gnu; do
    if has_both "$dir"; then echo "$dir"; return; fi
  done
  return 1
}

if [ -z "$lib_dir" ]; then
  lib_dir=$(find_lib_dir) || {
    echo "gpu-smoke: libnvidia-ml.so.1 and libcuda.so.1 not found; pass --lib-dir" >&2
    exit 12
  }
fi
if ! has_both "$lib_dir"; then
  echo "gpu-smoke: $lib_dir lacks libnvidia-ml.so.1 or libcuda.so.1" >&2
  exit 12
fi

python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$here/.venv/bin/python" ]; then python="$here/.venv/bin/python"; else python=python3; fi
fi
report=$(mktemp)
trap 'rm -f "$report"' EXIT
args=(verify --cuda-smoke --lib-dir "$lib_dir" --host-root / --proc-root /proc
      --sys-root /sys --output json --log-format json --log-level warning
      --termination-log /dev/null)
[ -n "$expect" ] && args+=(--expect-gpus "$expect")
status=0
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" -m installer "${args[@]}" \
  >"$report" || status=$?
[ -n "$json_out" ] && cp "$report" "$json_out"
if [ "$status" -ne 0 ]; then
  echo "gpu-smoke: FAILED (exit $status) with the driver in $lib_dir" >&2
  exit "$status"
fi
"$python" - "$report" <<'PY'
import json, sys
def bus(text):
    domain, _, rest = text.lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"

report = json.load(open(sys.argv[1]))
smoke = {bus(s["pci_bus_id"]) for s in (report["cuda"] or {}).get("smoke", [])}
for gpu in report["gpus"]:
    ok = "ok" if bus(gpu["pci_bus_id"]) in smoke else "not run"
    print(f"GPU {gpu['index']} {gpu['pci_bus_id']} {gpu['name']} {gpu['uuid']} "
          f"{gpu['memory_total_mib']} MiB driver {report['driver_version']} "
          f"CUDA {report['cuda_version']} vector-add {ok}")
PY
# The node agent's view: every GPU's NVLink fabric state through the agent's own
# reader, and the persistence mode it found, in one more line. Read-only: no daemon started.
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" - "$lib_dir" <<'PY'
import ctypes, sys
ctypes.CDLL(f"{sys.argv[1]}/libnvidia-ml.so.1")  # pynvml's own load then finds this one
import pynvml
from installer.node.gpufabric import fabric_summary, read_fabric
pynvml.nvmlInit()
try:
    count = pynvml.nvmlDeviceGetCount()
    modes = []
    for index in range(count):
        try:
            modes.append(pynvml.nvmlDeviceGetPersistenceMode(
                pynvml.nvmlDeviceGetHandleByIndex(index)) == 1)
        except pynvml.NVMLError:
            modes.append(None)
    fabric = fabric_summary(read_fabric())
finally:
    pynvml.nvmlShutdown()
known = [m for m in modes if m is not None]
persistence = (f"on for {sum(known)} of {count} GPUs" if known
               else "not reported by NVML")
print(f"agent view: fabric {fabric}; persistence mode {persistence}")
PY
# SM activity without DCGM: each GPU's GPM reading (Hopper and later) through the agent's own
# reader, over one 1 s interval, or why the GPU has none. Read-only.
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" - "$lib_dir" <<'PY'
import ctypes, sys
ctypes.CDLL(f"{sys.argv[1]}/libnvidia-ml.so.1")
import pynvml
from installer.agent.metrics.gpm import GpmReader

class Log:
    def __getattr__(self, level):
        return lambda *args, **fields: None

pynvml.nvmlInit()
try:
    handles = [(str(i), pynvml.nvmlDeviceGetHandleByIndex(i))
               for i in range(pynvml.nvmlDeviceGetCount())]
    found, errors = GpmReader(Log(), 1.0).read(handles)
finally:
    pynvml.nvmlShutdown()
for index, _ in handles:
    gpm = found[index]
    if not gpm.supported:
        print(f"GPM GPU {index}: not supported ({gpm.reason})")
        continue
    values = " ".join(f"{name} {value:.1f}%" for name, value in gpm.values.items())
    print(f"GPM GPU {index}: {values or 'no values'}")
for error in errors:
    print(f"GPM error: {error}")
PY
# MIG from the GPU's own answer: each GPU's MIG profiles as NVML gives them, planned by the
# installer's partition code, compared with the installer's MIG table. Read-only: the MIG mode
# is neither read for change nor set.
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" - "$lib_dir" <<'PY'
import ctypes, sys
ctypes.CDLL(f"{sys.argv[1]}/libnvidia-ml.so.1")
import pynvml
from installer.compat.mig import mig_model
from installer.stages.partition.nvml import discover

def sizes(model):
    return ", ".join(f"{name} x{p.max_count}" for name, p in sorted(
        model.profiles.items(), key=lambda item: (item[1].max_count, item[0])))

pynvml.nvmlInit()
try:
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        table, found = mig_model(name, total // 2**20), discover(handle, name, total)
        if found is None:
            print(f"MIG GPU {index}: NVML lists no MIG profiles; table: "
                  f"{table.name if table else 'no MIG'}")
            continue
        verdict = "agrees" if table is not None and sizes(table) == sizes(found) else (
            f"differs: {sizes(table)}" if table is not None else "has no such model")
        print(f"MIG GPU {index}: {found.name} from NVML: {sizes(found)}; table {verdict}")
finally:
    pynvml.nvmlShutdown()
PY
