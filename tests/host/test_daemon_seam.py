"""installer.node.daemons and installer.agent.fmconfig: real processes started with pid files
in a temp host tree and a record of each start, stopped through them, and never a process
the record does not prove ours.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from installer.agent import fmconfig
from installer.agent.daemons import persistenced_spec
from installer.config import load_config
from installer.errors import ConfigError
from installer.node import daemons, programs
from installer.node.host import RealHost, Roots

SLEEPER = "import signal, sys, time\n{handler}\nprint('up', flush=True)\ntime.sleep(300)\n"


def host(tmp_path: Path) -> RealHost:
    for name in ("proc", "sys", "dev"):
        (tmp_path / name).mkdir(exist_ok=True)
    return RealHost(Roots(tmp_path, tmp_path / "proc", tmp_path / "sys", tmp_path / "dev"))


def fake_daemon(tmp_path: Path, name: str, *, ignore_term: bool = False) -> list[str]:
    """A copy of this interpreter named like the daemon, under the host root (what the
    agent execs is a program file; /proc/PID/exe is then that copy), with its script."""
    program = tmp_path / "bin" / name
    program.parent.mkdir(exist_ok=True)
    shutil.copyfile(os.path.realpath(sys.executable), program)
    program.chmod(0o755)
    handler = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_term else ""
    return [str(program), "-c", SLEEPER.format(handler=handler)]


def start(node: RealHost, tmp_path: Path, name: str, argv: list[str],
          log_file: Path) -> daemons.Started:
    """start_daemon as the supervisor calls it: the program opened and hashed first."""
    path = Path(argv[0])
    program = programs.open_program(node, path, hashlib.sha256(path.read_bytes()).hexdigest())
    try:
        return daemons.start_daemon(node, name, argv, program=program, log_file=log_file,
                                    records=tmp_path / "records")
    finally:
        program.close()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except OSError:
        return False
    return state != "Z"


def wait_up(log_file: Path) -> None:
    deadline = time.monotonic() + 30
    while "up" not in log_file.read_text():  # its output is kept
        assert time.monotonic() < deadline
        time.sleep(0.05)


class TestStartAndStop:
    def test_start_writes_the_pid_file_on_the_node_and_stop_removes_it(
            self, tmp_path: Path) -> None:
        node = host(tmp_path)
        started = start(node, tmp_path, "nv-fabricmanager",
                        fake_daemon(tmp_path, "nv-fabricmanager"), tmp_path / "logs/fm.log")
        pid_file = tmp_path / "var/run/nvidia-fabricmanager/nv-fabricmanager.pid"
        assert started.pid_file == pid_file
        assert pid_file.read_text() == f"{started.pid}\n"
        assert started.start_ticks == programs.start_ticks(started.pid)
        wait_up(tmp_path / "logs/fm.log")
        assert os.readlink(f"/proc/{started.pid}/exe") == str(tmp_path / "bin/nv-fabricmanager")
        records = tmp_path / "records"
        assert daemons.running_pid(pid_file, "nv-fabricmanager", records) == started.pid
        assert daemons.stop_daemon(node, pid_file, timeout_s=10, records=records) is True
        assert started.process.wait(timeout=10) == -signal.SIGTERM
        assert not pid_file.exists()
        assert not (records / "nv-fabricmanager.json").exists()

    def test_sigkill_after_the_timeout(self, tmp_path: Path) -> None:
        node = host(tmp_path)
        started = start(node, tmp_path, "nvidia-persistenced",
                        fake_daemon(tmp_path, "nvidia-persistenced", ignore_term=True),
                        tmp_path / "p.log")
        wait_up(tmp_path / "p.log")  # SIGTERM ignored from here
        begin = time.monotonic()
        assert daemons.stop_daemon(node, started.pid_file, timeout_s=1.0,
                                   records=tmp_path / "records") is True
        assert time.monotonic() - begin >= 1.0  # waited for SIGTERM first
        assert started.process.wait(timeout=10) == -signal.SIGKILL

    def test_a_pid_file_naming_another_program_is_never_signalled(
            self, tmp_path: Path) -> None:
        """A recycled pid: the file says nv-fabricmanager, the process is something else,
        even one whose argv names the daemon."""
        node = host(tmp_path)
        other = subprocess.Popen(["sleep", "300"], executable=shutil.which("sleep"))
        try:
            pid_file = daemons.pid_file(node, "nv-fabricmanager")
            pid_file.parent.mkdir(parents=True)
            pid_file.write_text(f"{other.pid}\n")
            assert daemons.stop_daemon(node, pid_file, timeout_s=1,
                                       records=tmp_path / "records") is False
            assert alive(other.pid)
            assert pid_file.exists()  # not ours to judge: left as found
        finally:
            other.kill()
            other.wait()

    @pytest.mark.parametrize("content", ["", "garbage\n", "-1\n", "99999999\n"])
    def test_stale_or_malformed_pid_files_are_removed(self, tmp_path: Path,
                                                       content: str) -> None:
        node = host(tmp_path)
        pid_file = daemons.pid_file(node, "nvlsm")
        pid_file.parent.mkdir(parents=True)
        pid_file.write_text(content)
        assert daemons.stop_daemon(node, pid_file, timeout_s=1,
                                   records=tmp_path / "records") is False
        assert not pid_file.exists()

    def test_a_dead_daemons_pid_file_is_stale(self, tmp_path: Path) -> None:
        node = host(tmp_path)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        pid_file = daemons.pid_file(node, "nvidia-persistenced")
        pid_file.parent.mkdir(parents=True)
        pid_file.write_text(f"{gone.pid}\n")
        assert daemons.stop_all(node, timeout_s=1, records=tmp_path / "records") == []
        assert not pid_file.exists()

    def test_stop_all_stops_every_known_daemon(self, tmp_path: Path) -> None:
        node = host(tmp_path)
        started = [start(node, tmp_path, name, fake_daemon(tmp_path, name),
                         tmp_path / f"{name}.log")
                   for name in ("nvidia-persistenced", "nv-fabricmanager")]
        assert daemons.stop_all(node, timeout_s=10, records=tmp_path / "records") == [
            "nv-fabricmanager", "nvidia-persistenced"]
        assert all(one.process.wait(timeout=10) < 0 for one in started)
        assert not any(os.path.exists(one.pid_file) for one in started)


class TestFabricManagerConfig:
    CONFIG = "# comment\nLOG_LEVEL=4\nDAEMONIZE=1\n  FABRIC_MODE = 0\nBIND_INTERFACE_IP=127.0.0.1\n"

    def test_overrides_replace_fields_and_the_agent_keeps_it_in_the_foreground(self) -> None:
        overrides = fmconfig.overrides_from_env({"NVFM_CONFIG_LOG_LEVEL": "2",
                                                 "NVFM_CONFIG_FABRIC_MODE": "1",
                                                 "PATH": "/usr/bin"})
        assert overrides == {"LOG_LEVEL": "2", "FABRIC_MODE": "1"}
        assert fmconfig.render(self.CONFIG, overrides).splitlines() == [
            "# comment", "LOG_LEVEL=2", "DAEMONIZE=0", "FABRIC_MODE=1",
            "BIND_INTERFACE_IP=127.0.0.1"]

    def test_defaults_apply_to_fields_the_file_has_unless_overridden(self) -> None:
        text = "TOPOLOGY_FILE_PATH=/usr/share/nvidia/nvswitch\nDATABASE_PATH=/x\n"
        defaults = {"TOPOLOGY_FILE_PATH": "/staged/etc", "DATABASE_PATH": "/staged/etc",
                    "NOT_IN_FILE": "1"}
        assert fmconfig.render(text, {"DATABASE_PATH": "/mine"}, defaults).splitlines() == [
            "TOPOLOGY_FILE_PATH=/staged/etc", "DATABASE_PATH=/mine", "DAEMONIZE=0"]

    def test_a_config_without_daemonize_gets_it(self) -> None:
        assert fmconfig.render("LOG_LEVEL=4", {}).splitlines() == ["LOG_LEVEL=4",
                                                                    "DAEMONIZE=0"]

    @pytest.mark.parametrize(("env", "words"), [
        ({"NVFM_CONFIG_log_level": "2"}, "does not name a Fabric Manager field"),
        ({"NVFM_CONFIG_": "2"}, "does not name a Fabric Manager field"),
        ({"NVFM_CONFIG_LOG_LEVEL": "2\nDAEMONIZE=1"}, "is invalid"),
        ({"NVFM_CONFIG_LOG_LEVEL": "a b"}, "is invalid"),
        ({"NVFM_CONFIG_LOG_LEVEL": "x" * 257}, "is invalid"),
        ({"NVFM_CONFIG_DAEMONIZE": "1"}, "set by the agent itself"),
    ])
    def test_bad_names_and_values_are_refused(self, env: dict[str, str], words: str) -> None:
        with pytest.raises(ConfigError) as raised:
            fmconfig.overrides_from_env(env)
        assert words in raised.value.message and raised.value.code == 2

    def test_a_field_the_staged_config_lacks_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="has no field NO_SUCH"):
            fmconfig.render(self.CONFIG, {"NO_SUCH": "1"})


class TestPersistencedCommandLine:
    """`--uvm-persistence-mode` only where the branch has it (R550+), or as the setting says."""

    def test_auto_follows_the_driver_branch(self, tmp_path: Path) -> None:
        config = load_config({"host_root": str(tmp_path), "proc_root": str(tmp_path),
                              "sys_root": str(tmp_path)}, {})
        binary = Path("/x/bin/nvidia-persistenced")
        assert persistenced_spec(config, binary, "535.261.03").argv == (
            str(binary), "--persistence-mode", "--foreground")
        assert persistenced_spec(config, binary, "550.163.01").argv == (
            str(binary), "--persistence-mode", "--uvm-persistence-mode", "--foreground")

    def test_the_setting_forces_it(self, tmp_path: Path) -> None:
        roots = {"host_root": str(tmp_path), "proc_root": str(tmp_path),
                 "sys_root": str(tmp_path)}
        on = load_config({**roots, "uvm_persistence_mode": "on"}, {})
        off = load_config(roots, {"UVM_PERSISTENCE_MODE": "off"})
        binary = Path("/x/nvidia-persistenced")
        assert "--uvm-persistence-mode" in persistenced_spec(on, binary, "535.261.03").argv
        assert "--uvm-persistence-mode" not in persistenced_spec(off, binary, "570.1").argv
        with pytest.raises(ConfigError, match="UVM_PERSISTENCE_MODE='sometimes' is invalid"):
            load_config(roots, {"UVM_PERSISTENCE_MODE": "sometimes"})
        with pytest.raises(ConfigError, match="AGENT_INTERVAL='1' is invalid"):
            load_config(roots, {"AGENT_INTERVAL": "1"})  # no busy polling
