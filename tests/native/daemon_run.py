"""What the daemon stand-ins run (tests/native/daemons.py builds them): `main`, called by
the compiled program with its name and version, parses the real daemon's command line,
detaches or serves in the foreground, keeps the pid file and the fabric file, and stops
on SIGTERM or SIGINT as tests/native/daemons.py describes. The sources it follows are the ones
cited there: nvidia-persistenced's pid file and options in NVIDIA/nvidia-persistenced at
410f35493c277b5767877b65bb011f7f66a60ed1 (nvidia-persistenced.c, nvpd_defs.h,
option-table.h).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from native.daemons import (
    COMPLETED,
    FM,
    IMEX,
    IN_PROGRESS,
    LOG,
    NOT_STARTED,
    NVLSM,
    PERSISTENCED,
    ROOT_ENV,
    _write_atomic,
    pid_file,
    write_fabric,
)

_ENV_PREFIX = {FM: "FAKE_FM", NVLSM: "FAKE_NVLSM", PERSISTENCED: "FAKE_PERSISTENCED",
               IMEX: "FAKE_IMEX"}
_STEP_S = 0.05


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
    parse = {FM: _fm_args, NVLSM: _nvlsm_args, PERSISTENCED: _persistenced_args,
             IMEX: _imex_args}[name]
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
    body = {FM: _fabric_manager, NVLSM: _idle, PERSISTENCED: _persistence, IMEX: _idle}[name]
    if options.get("detach"):
        return _detached(run, lambda: body(run, options))
    return _serve(run, lambda: body(run, options))


def _version_line(name: str, version: str) -> str:
    if name == FM:
        return f"Fabric Manager version is : {version}"
    if name == PERSISTENCED:
        return f"nvidia-persistenced:  version {version}"
    if name == IMEX:
        return f"IMEX version is: {version}"
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


def _imex_args(argv: list[str], version: str) -> dict[str, object]:
    config = _value(argv, "-c", "--config")
    if config is None or not Path(config).is_file():
        raise ValueError(f"failed to open config file {config}")
    settings = _config(Path(config))
    nodes = settings.get("IMEX_NODE_CONFIG_FILE", "/etc/nvidia-imex/nodes_config.cfg")
    if not Path(nodes).is_file():
        raise ValueError(f"failed to read the node config file {nodes}")
    driver = os.environ.get("FAKE_NVML_DRIVER") or "535.261.03"
    if driver != version:
        raise ValueError(f"IMEX version {version} is not compatible with the loaded driver "
                         f"{driver}")
    return {"detach": settings.get("DAEMONIZE", "1") == "1", "config": settings}


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
