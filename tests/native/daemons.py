"""Stand-ins for NVIDIA's fabric and persistence daemons, with their real command lines.

`write_daemon_standins(bin_dir, version=...)` writes three executables that behave, as far
as the agent can see, like the ones below. Each is a real ELF program (daemon_standin.c,
compiled once per name and version, cached): the agent execs a daemon through a descriptor
of its staged file and adopts or stops one only when `/proc/PID/exe` is that file, which a
script run by an interpreter would not be. The program embeds this interpreter, which runs
`main` of tests/native/daemon_run.py:

- `nv-fabricmanager -c <cfg> [-g <guid>]`: Fabric Manager. Fails (exit 1) when the config
  file is missing or its version differs from the driver's (FAKE_NVML_DRIVER, default
  535.261.03), as the real one does. Detaches when the config says `DAEMONIZE=1` (the
  shipped default), stays in the foreground otherwise. Writes
  `<root>/var/run/nvidia-fabricmanager/nv-fabricmanager.pid`, then moves every GPU's line
  of FAKE_NVML_FABRIC_FILE from not-started through in-progress to completed: GPU i of n
  completes FAKE_FM_SECONDS * (i+1)/n seconds after start (default 1.0 s), with status
  FAKE_FM_STATUS (default 0). With FAKE_FM_NEEDS_NVLSM=1 (an NVLink5 node) it waits, fabric
  not-started, until the nvlsm pid file names a live process.
- `nvlsm -F <conf> [-B] [--pid_file <path>] [-g <guid>]`: the NVLink Subnet Manager (as
  nvidia-fabricmanager-start.sh runs it). `-B` detaches. Pid file: `--pid_file`, default
  `<root>/var/run/nvidia-fabricmanager/nvlsm.pid`.
- `nvidia-persistenced [--persistence-mode | --no-persistence-mode]
  [--uvm-persistence-mode] [-f]`: detaches unless `-f`; writes
  `<root>/var/run/nvidia-persistenced/nvidia-persistenced.pid` and "1" (persistence on) to
  FAKE_NVML_PERSISTENCE_FILE, which the NVML stand-in reports; "0" again when it exits.
  Drivers before 550 do not know `--uvm-persistence-mode` (exit 1, as nvgetopt does).

- `nvidia-imex -c <cfg>`: GB200/GB300's IMEX service, as NVIDIA's IMEX guide describes it
  (docs.nvidia.com/multi-node-nvlink-systems/imex-guide, "Getting Started" and "IMEX
  Service Config Options"): fails (exit 1) when the config is missing, when the file its
  IMEX_NODE_CONFIG_FILE names (default /etc/nvidia-imex/nodes_config.cfg) cannot be read,
  or when its version is not the loaded driver's; detaches unless `DAEMONIZE=0` (the
  guide's default is 1). Pid file `<root>/var/run/nvidia-imex/nvidia-imex.pid` (the agent's
  path: the guide names none).
A detached stand-in writes its log lines to `<root>/var/log/<name>.log`; in the foreground
they go to stderr. All three print `--version` (`version` given to write_daemon_standins)
and stop on SIGTERM or SIGINT: exit 0, pid file removed, and for Fabric Manager the fabric
back to not-started.
A crash (FAKE_<D>_FAIL=after:<s>, D in FM, NVLSM, PERSISTENCED) exits 1 after s seconds and
leaves its pid file behind (stale, as a real crash does); Fabric Manager's fabric goes back
to not-started. FAKE_<D>_FAIL=start exits 1 before its pid file is written; FAKE_FM_FAIL=
never-complete keeps the fabric in-progress. SIGKILL leaves everything as it was.

Sources followed: nvidia-persistenced's pid file (`NVPD_PID_FILE`, nvidia-persistenced.c and
nvpd_defs.h) and its `--persistence-mode` and `--uvm-persistence-mode` options
(option-table.h), in NVIDIA/nvidia-persistenced at 410f35493c277b5767877b65bb011f7f66a60ed1
(its `-f`, to stay in the foreground, is the stand-in's own: that source has no such option).

The root: every default path above lies under FAKE_DAEMON_ROOT (a temp host tree); a stand-in
refuses to start without it (exit 2), so no test writes the machine's /var/run. A `--pid_file`
given as an absolute path outside that root is taken relative to it. Each start appends
{"name", "argv", "pid"} as one JSON line to `<root>/var/log/daemon-standins.jsonl`
(`started()` reads them). GPU count: FAKE_NVML_GPUS (default 1), as the NVML stand-in; the
fabric file: FAKE_NVML_FABRIC_FILE (default `<root>/fabric`), rewritten atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT_ENV = "FAKE_DAEMON_ROOT"
FM = "nv-fabricmanager"
NVLSM = "nvlsm"
PERSISTENCED = "nvidia-persistenced"
IMEX = "nvidia-imex"
PID_FILES = {
    IMEX: "var/run/nvidia-imex/nvidia-imex.pid",
    FM: "var/run/nvidia-fabricmanager/nv-fabricmanager.pid",
    NVLSM: "var/run/nvidia-fabricmanager/nvlsm.pid",
    PERSISTENCED: "var/run/nvidia-persistenced/nvidia-persistenced.pid",
}
LOG = "var/log/daemon-standins.jsonl"
NOT_STARTED, IN_PROGRESS, COMPLETED = 1, 2, 3
STANDIN_CACHE = Path.home() / ".cache/gpu-node-installer-test/daemon-standins"


def write_daemon_standins(bin_dir: Path, *, version: str,
                          nvlsm_version: str | None = None) -> None:
    """nv-fabricmanager, nvlsm, nvidia-persistenced and nvidia-imex executables in
    `bin_dir`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in (FM, NVLSM, PERSISTENCED, IMEX):
        shown = nvlsm_version or version if name == NVLSM else version
        shutil.copyfile(standin_program(name, shown), bin_dir / name)
        (bin_dir / name).chmod(0o755)


def standin_program(name: str, version: str) -> Path:
    """The compiled stand-in `name` printing `version`, from the per-user cache (gcc once
    per name, version and interpreter; a temp file renamed into place, so runs in parallel
    never see half a file)."""
    tests_dir = str(Path(__file__).resolve().parent.parent)
    include, libdir = sysconfig.get_paths()["include"], sysconfig.get_config_var("LIBDIR")
    source = (Path(__file__).parent / "daemon_standin.c").read_bytes()
    key = hashlib.sha256(repr((source, name, version, tests_dir, include, libdir,
                               sys.version)).encode()).hexdigest()[:20]
    program = STANDIN_CACHE / key / name
    if program.is_file():
        return program
    program.parent.mkdir(parents=True, exist_ok=True)
    temp = program.with_name(f".{name}.{os.getpid()}.tmp")
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc is missing: run `make deps` (scripts/install-deps.sh)")
    if not (Path(include) / "Python.h").is_file():
        raise RuntimeError(f"{include}/Python.h is missing: the daemon stand-ins embed this "
                           "interpreter (install its headers and libpython, e.g. "
                           "python3.11-dev, or use a Python built with them)")
    library = f"python{sysconfig.get_config_var('LDVERSION')}"
    subprocess.run([gcc, "-O1", "-Wall", "-Werror", f"-I{include}",
                    f"-DSTANDIN_NAME={_c_string(repr(name))}",
                    f"-DSTANDIN_VERSION={_c_string(repr(version))}",
                    f"-DTESTS_DIR={_c_string(repr(tests_dir))}",
                    str(Path(__file__).parent / "daemon_standin.c"), "-o", str(temp),
                    f"-L{libdir}", f"-l{library}", f"-Wl,-rpath,{libdir}"], check=True)
    os.replace(temp, program)
    return program


def _c_string(text: str) -> str:
    """`text` as a C string literal (what the compiler's -D gets)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def pid_file(root: Path, name: str) -> Path:
    """Where the stand-in `name` writes its pid under the root (the real default path)."""
    return root / PID_FILES[name]


def write_fabric(path: Path, lines: list[tuple[int, int]]) -> None:
    """Set every GPU's (state, status) for the NVML stand-in, atomically."""
    _write_atomic(path, "".join(f"{state} {status}\n" for state, status in lines))


def read_fabric_file(path: Path) -> list[tuple[int, int]]:
    """The (state, status) lines as the stand-ins last wrote them."""
    if not path.is_file():
        return []
    return [(int(a), int(b)) for a, b, *_ in
            (line.split() for line in path.read_text().splitlines() if line.strip())]


def started(root: Path) -> list[dict[str, object]]:
    """Every stand-in start under `root`, oldest first."""
    log = root / LOG
    if not log.is_file():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def _write_atomic(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text, encoding="utf-8")
    os.replace(temp, path)
