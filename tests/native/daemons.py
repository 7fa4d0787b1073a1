"""Stand-ins for NVIDIA's fabric and persistence daemons, with their real command lines.

`write_daemon_standins(bin_dir, version=...)` writes three executables that behave, as far
as the agent can see, like the ones below. Each is a real ELF program (daemon_standin.c,
compiled once per name and version, cached): the agent execs a daemon through a descriptor
of its staged file and adopts or stops one only when `/proc/PID/exe` is that file, which a
script run by an interpreter would not be. The program embeds this interpreter, which runs
`main` below:

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
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT_ENV = "FAKE_DAEMON_ROOT"
FM = "nv-fabricmanager"
NVLSM = "nvlsm"
PERSISTENCED = "nvidia-persistenced"
PID_FILES = {
    FM: "var/run/nvidia-fabricmanager/nv-fabricmanager.pid",
    NVLSM: "var/run/nvidia-fabricmanager/nvlsm.pid",
    PERSISTENCED: "var/run/nvidia-persistenced/nvidia-persistenced.pid",
}
LOG = "var/log/daemon-standins.jsonl"
NOT_STARTED, IN_PROGRESS, COMPLETED = 1, 2, 3
_ENV_PREFIX = {FM: "FAKE_FM", NVLSM: "FAKE_NVLSM", PERSISTENCED: "FAKE_PERSISTENCED"}
_STEP_S = 0.05
STANDIN_CACHE = Path.home() / ".cache/gpu-node-installer-test/daemon-standins"


def write_daemon_standins(bin_dir: Path, *, version: str,
                          nvlsm_version: str | None = None) -> None:
    """nv-fabricmanager, nvlsm and nvidia-persistenced executables in `bin_dir`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in (FM, NVLSM, PERSISTENCED):
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


# ---- what the executables run ----


@dataclass
class _Run:
    """One stand-in process: its name, root, pid file and stop flag."""

    name: str
    version: str
    root: Path
    pid_path: Path
    stopping: bool = False

    def log(self, message: str) -> None:
        print(f"[{self.name}] {message}", file=sys.stderr, flush=True)

    def fail_mode(self) -> str:
        return os.environ.get(f"{_ENV_PREFIX[self.name]}_FAIL", "")

    def crash_after(self) -> float | None:
        mode = self.fail_mode()
        return float(mode.split(":", 1)[1]) if mode.startswith("after:") else None


def main(name: str, version: str, argv: list[str]) -> int:
    """Entry point of each executable."""
    if "--version" in argv or ("-v" in argv and name == PERSISTENCED):
        print(_version_line(name, version))
        return 0
    root_text = os.environ.get(ROOT_ENV, "")
    if not root_text:
        print(f"{name} stand-in: {ROOT_ENV} is not set (the temp root for pid files)",
              file=sys.stderr)
        return 2
    root = Path(root_text)
    _record(root, name, argv)
    parse = {FM: _fm_args, NVLSM: _nvlsm_args, PERSISTENCED: _persistenced_args}[name]
    try:
        options = parse(argv, version)
    except ValueError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    pid_path = options.get("pid_file") or pid_file(root, name)
    run = _Run(name, version, root, _under_root(root, Path(pid_path)))
    if run.fail_mode() == "start":
        run.log("failed to start (FAKE fail=start)")
        return 1
    body = {FM: _fabric_manager, NVLSM: _idle, PERSISTENCED: _persistence}[name]
    if options.get("detach"):
        return _detached(run, lambda: body(run, options))
    return _serve(run, lambda: body(run, options))


def _version_line(name: str, version: str) -> str:
    if name == FM:
        return f"Fabric Manager version is : {version}"
    if name == PERSISTENCED:
        return f"nvidia-persistenced:  version {version}"
    return f"NVLSM version {version}"


def _record(root: Path, name: str, argv: list[str]) -> None:
    log = root / LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"name": name, "argv": argv, "pid": os.getpid()}) + "\n")


def _under_root(root: Path, path: Path) -> Path:
    if not path.is_absolute() or path.is_relative_to(root):
        return path
    return root / path.relative_to("/")


def _fm_args(argv: list[str], version: str) -> dict[str, object]:
    config = _value(argv, "-c", "--config")
    if config is None or not Path(config).is_file():
        raise ValueError(f"failed to open config file {config}: no such file "
                         "(usage: nv-fabricmanager -c <config file>)")
    driver = os.environ.get("FAKE_NVML_DRIVER") or "535.261.03"
    if driver != version:
        raise ValueError(f"fabric manager version {version} and driver version {driver} "
                         "do not match; install the matching Fabric Manager")
    settings = _config(Path(config))
    return {"detach": settings.get("DAEMONIZE", "0") == "1", "config": settings}


def _nvlsm_args(argv: list[str], version: str) -> dict[str, object]:
    config = _value(argv, "-F", "--config")
    if config is None or not Path(config).is_file():
        raise ValueError(f"cannot open the configuration file {config}")
    return {"detach": "-B" in argv, "pid_file": _value(argv, "--pid_file")}


def _persistenced_args(argv: list[str], version: str) -> dict[str, object]:
    known = {"--persistence-mode", "--no-persistence-mode", "-f", "--foreground",
             "--verbose", "-V"}
    if _major(version) >= 550:
        known.add("--uvm-persistence-mode")
    for arg in argv:
        if arg not in known:
            raise ValueError(f'Unrecognized option: "{arg}"')
    return {"detach": not {"-f", "--foreground"} & set(argv),
            "persistence": "--no-persistence-mode" not in argv}


def _major(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def _value(argv: list[str], *flags: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg in flags and index + 1 < len(argv):
            return argv[index + 1]
    return None


def _config(path: Path) -> dict[str, str]:
    settings = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            settings[key.strip()] = value.strip()
    return settings


def _detached(run: _Run, body: Callable[[], int]) -> int:
    """Fork like a daemon: the parent exits with the child's start result (0 once the pid
    file is written), the child carries on in its own session, its output in
    <root>/var/log/<name>.log (a daemon keeps no terminal)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child:
        os.close(write_end)
        status = os.read(read_end, 1)
        os.close(read_end)
        return 0 if status == b"0" else 1
    os.close(read_end)
    os.setsid()
    log = run.root / "var" / "log" / f"{run.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    code = _serve(run, body, ready=lambda: os.write(write_end, b"0"))
    os._exit(code)


def _serve(run: _Run, body: Callable[[], int], ready: Callable[[], object] | None = None
           ) -> int:
    """Install the stop handlers, write the pid file, run the body."""
    def stop(signum: int, frame: object) -> None:
        run.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    run.pid_path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(run.pid_path, f"{os.getpid()}\n")
    run.log(f"started, version {run.version}, pid {os.getpid()}")
    if ready:
        ready()
    code = body()
    if code == 0 and run.pid_path.read_text().strip() == str(os.getpid()):
        run.pid_path.unlink()
    return code


def _wait(run: _Run, until: float, done: Callable[[], bool] = lambda: False) -> str:
    """Sleep in small steps until `until` (monotonic): "stop", "crash", "done" or "time"."""
    crash = run.crash_after()
    crash_at = None if crash is None else _START + crash
    while True:
        if run.stopping:
            return "stop"
        now = time.monotonic()
        if crash_at is not None and now >= crash_at:
            return "crash"
        if done():
            return "done"
        if now >= until:
            return "time"
        time.sleep(_STEP_S)


_START = time.monotonic()


def _end(run: _Run, reason: str) -> int:
    if reason == "crash":
        run.log("fatal error: exiting (FAKE fail=after)")
        return 1
    run.log("received a stop signal, exiting")
    return 0


def _idle(run: _Run, options: dict[str, object]) -> int:
    return _end(run, _wait(run, float("inf")))


def _fabric_manager(run: _Run, options: dict[str, object]) -> int:
    path = Path(os.environ.get("FAKE_NVML_FABRIC_FILE") or run.root / "fabric")
    gpus = max(int(os.environ.get("FAKE_NVML_GPUS") or 1), 0)
    seconds = float(os.environ.get("FAKE_FM_SECONDS") or 1.0)
    status = int(os.environ.get("FAKE_FM_STATUS") or 0)
    write_fabric(path, [(NOT_STARTED, 0)] * gpus)
    reason = "done"
    if os.environ.get("FAKE_FM_NEEDS_NVLSM") == "1":
        run.log("waiting for the NVLink Subnet Manager")
        reason = _wait(run, float("inf"), lambda: _alive(pid_file(run.root, NVLSM)))
    if reason == "done":
        reason = _train(run, path, gpus, seconds, status)
    write_fabric(path, [(NOT_STARTED, 0)] * gpus)
    return _end(run, reason)


def _train(run: _Run, path: Path, gpus: int, seconds: float, status: int) -> str:
    """In-progress, then each GPU completes in turn; then serve until stopped."""
    begin = time.monotonic()
    never = run.fail_mode() == "never-complete"
    write_fabric(path, [(IN_PROGRESS, 0)] * gpus)
    for done in range(1, gpus + 1):
        if never:
            break
        reason = _wait(run, begin + seconds * done / gpus)
        if reason != "time":
            return reason
        write_fabric(path, [(COMPLETED, status)] * done + [(IN_PROGRESS, 0)] * (gpus - done))
    if not never:
        run.log("fabric training completed")
    return _wait(run, float("inf"))


def _alive(path: Path) -> bool:
    try:
        os.kill(int(path.read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


def _persistence(run: _Run, options: dict[str, object]) -> int:
    mode_file = os.environ.get("FAKE_NVML_PERSISTENCE_FILE")
    if mode_file:
        _write_atomic(Path(mode_file), "1\n" if options["persistence"] else "0\n")
    reason = _wait(run, float("inf"))
    if mode_file:
        _write_atomic(Path(mode_file), "0\n")
    return _end(run, reason)
