"""The daemon stand-ins' lifecycles, observed as the agent observes the real daemons:
through the real pynvml over the NVML stand-in, pid files at the real default paths (under a
temp root), exit codes and signals."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml  # type: ignore[import-untyped]
import pytest
from native.daemons import (
    FM,
    NVLSM,
    PERSISTENCED,
    pid_file,
    started,
    write_daemon_standins,
    write_fabric,
)
from native.nvmlsession import nvml_session

from installer.node.gpufabric import fabric_summary, read_fabric

VERSION = "535.261.03"
DEADLINE_S = 30.0  # generous: a loaded 2-core machine


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("bin")
    write_daemon_standins(directory, version=VERSION)
    return directory


class Node:
    """A temp root, the stand-ins' environment, and every process a test started."""

    def __init__(self, root: Path, bin_dir: Path, libs: Path) -> None:
        self.root, self.bin_dir, self.libs = root, bin_dir, libs
        self.fabric = root / "fabric"
        self.persistence = root / "persistence"
        self.fm_config = root / "usr/share/nvidia/nvswitch/fabricmanager.cfg"
        self.sm_config = root / "usr/share/nvidia/nvlsm/nvlsm.conf"
        for path, text in ((self.fm_config, "DAEMONIZE=0\nLOG_LEVEL=4\n"),
                           (self.sm_config, "log_file /var/log/nvlsm.log\n")):
            path.parent.mkdir(parents=True)
            path.write_text(text)
        self.procs: list[subprocess.Popen[str]] = []
        write_fabric(self.fabric, [(1, 0)] * 8)  # a fabric node before Fabric Manager

    def start(self, name: str, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([str(self.bin_dir / name), *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def run(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin_dir / name), *args], capture_output=True,
                              text=True, timeout=DEADLINE_S)

    def fabric_summary(self) -> str:
        with nvml_session(self.libs):
            return fabric_summary(read_fabric())

    def persistence_mode(self) -> int:
        with nvml_session(self.libs):
            return int(pynvml.nvmlDeviceGetPersistenceMode(pynvml.nvmlDeviceGetHandleByIndex(0)))

    def pid(self, name: str) -> int:
        return int(pid_file(self.root, name).read_text())

    def cleanup(self) -> None:
        """Kill what this test started (by pid, checked to be one of our stand-ins)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for name in (FM, NVLSM, PERSISTENCED):
            path = pid_file(self.root, name)
            if path.is_file() and _running(int(path.read_text())) and str(
                    self.bin_dir) in _cmdline(int(path.read_text())):
                os.kill(int(path.read_text()), signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        time.sleep(0.05)


@pytest.fixture
def node(tmp_path: Path, bin_dir: Path, libs: Path,
         fake_env: pytest.MonkeyPatch) -> Iterator[Node]:
    made = Node(tmp_path / "root", bin_dir, libs)
    for name, value in {"FAKE_DAEMON_ROOT": str(made.root), "FAKE_NVML_GPUS": "8",
                        "FAKE_NVML_FABRIC_FILE": str(made.fabric), "FAKE_FM_SECONDS": "0.8",
                        "FAKE_NVML_PERSISTENCE_FILE": str(made.persistence)}.items():
        fake_env.setenv(name, value)
    yield made
    made.cleanup()


class TestFabricManager:
    def test_fabric_completes_then_sigterm_returns_it_to_not_started(
            self, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_FM_SECONDS", "3")
        proc = node.start(FM, "-c", str(node.fm_config))
        seen: list[str] = []

        def completed() -> bool:
            seen.append(node.fabric_summary())
            return seen[-1] == "8 GPUs: 8 completed"

        wait_for(completed, "fabric completed")
        assert any("in-progress" in s for s in seen)
        done = [int(s.split(": ")[1].split()[0]) if "completed" in s else 0 for s in seen]
        assert done == sorted(done)  # GPUs complete one after another, never go back
        assert node.pid(FM) == proc.pid
        assert f"{FM} -c {node.fm_config}" in _cmdline(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE_S) == 0
        assert not pid_file(node.root, FM).exists()
        assert node.fabric_summary() == "8 GPUs: 8 not-started"

    def test_detaches_when_the_config_says_daemonize(self, node: Node) -> None:
        node.fm_config.write_text("DAEMONIZE=1\n")
        launcher = node.run(FM, "-c", str(node.fm_config))
        assert launcher.returncode == 0, launcher.stderr
        pid = node.pid(FM)
        assert _running(pid) and not launcher.stdout
        wait_for(lambda: node.fabric_summary() == "8 GPUs: 8 completed", "fabric completed")
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not _running(pid), "daemon gone")
        assert not pid_file(node.root, FM).exists()
        assert node.fabric_summary() == "8 GPUs: 8 not-started"

    def test_fail_at_start(self, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_FM_FAIL", "start")
        result = node.run(FM, "-c", str(node.fm_config))
        assert result.returncode == 1 and "failed to start" in result.stderr
        assert not pid_file(node.root, FM).exists()

    def test_missing_config_fails_like_the_real_one(self, node: Node) -> None:
        result = node.run(FM, "-c", str(node.root / "nope.cfg"))
        assert result.returncode == 1 and "failed to open config file" in result.stderr

    def test_version_must_match_the_driver(self, node: Node,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
        assert node.run(FM, "--version").stdout.strip() == (
            f"Fabric Manager version is : {VERSION}")
        monkeypatch.setenv("FAKE_NVML_DRIVER", "550.54.15")
        result = node.run(FM, "-c", str(node.fm_config))
        assert result.returncode == 1
        assert f"version {VERSION} and driver version 550.54.15" in result.stderr

    def test_crash_after_completion(self, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_FM_SECONDS", "0.3")
        monkeypatch.setenv("FAKE_FM_FAIL", "after:2")
        proc = node.start(FM, "-c", str(node.fm_config))
        wait_for(lambda: node.fabric_summary() == "8 GPUs: 8 completed", "fabric completed")
        assert proc.wait(timeout=DEADLINE_S) == 1
        assert "fatal error" in (proc.stderr.read() if proc.stderr else "")
        assert node.fabric_summary() == "8 GPUs: 8 not-started"
        assert node.pid(FM) == proc.pid  # a crash leaves its pid file behind

    def test_never_completes(self, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_FM_SECONDS", "0.2")
        monkeypatch.setenv("FAKE_FM_FAIL", "never-complete")
        proc = node.start(FM, "-c", str(node.fm_config))
        wait_for(lambda: node.fabric_summary() == "8 GPUs: 8 in-progress", "in progress")
        time.sleep(1.0)  # five times FAKE_FM_SECONDS
        assert node.fabric_summary() == "8 GPUs: 8 in-progress"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE_S) == 0

    def test_sigkill_leaves_everything_as_it_was(self, node: Node) -> None:
        proc = node.start(FM, "-c", str(node.fm_config))
        wait_for(lambda: node.fabric_summary() == "8 GPUs: 8 completed", "fabric completed")
        proc.kill()
        proc.wait()
        assert node.fabric_summary() == "8 GPUs: 8 completed"
        assert node.pid(FM) == proc.pid


class TestNvlink5:
    def test_fabric_manager_waits_for_the_subnet_manager(
            self, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_FM_NEEDS_NVLSM", "1")
        fm = node.start(FM, "-c", str(node.fm_config), "-g", "0x7425540300353de9")
        wait_for(lambda: pid_file(node.root, FM).exists(), "FM pid file")
        time.sleep(0.5)
        assert node.fabric_summary() == "8 GPUs: 8 not-started"
        launcher = node.run(NVLSM, "-F", str(node.sm_config), "-B", "--pid_file",
                            "/var/run/nvidia-fabricmanager/nvlsm.pid",
                            "-g", "0x7425540300353de9")
        assert launcher.returncode == 0, launcher.stderr
        sm_pid = node.pid(NVLSM)  # the absolute path landed under the root
        assert _running(sm_pid) and "--pid_file" in _cmdline(sm_pid)
        wait_for(lambda: node.fabric_summary() == "8 GPUs: 8 completed", "fabric completed")
        os.kill(sm_pid, signal.SIGTERM)
        wait_for(lambda: not _running(sm_pid), "nvlsm gone")
        assert not pid_file(node.root, NVLSM).exists()
        fm.send_signal(signal.SIGTERM)
        assert fm.wait(timeout=DEADLINE_S) == 0

    def test_subnet_manager_failures(self, node: Node,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
        assert node.run(NVLSM, "--version").stdout.strip() == f"NVLSM version {VERSION}"
        assert node.run(NVLSM, "-F", str(node.root / "none.conf")).returncode == 1
        monkeypatch.setenv("FAKE_NVLSM_FAIL", "after:0.3")
        proc = node.start(NVLSM, "-F", str(node.sm_config))
        assert proc.wait(timeout=DEADLINE_S) == 1
        assert node.pid(NVLSM) == proc.pid


class TestPersistenced:
    def test_detaches_turns_persistence_on_and_off(self, node: Node) -> None:
        launcher = node.run(PERSISTENCED, "--persistence-mode")
        assert launcher.returncode == 0, launcher.stderr
        pid = node.pid(PERSISTENCED)
        assert _running(pid)  # the launcher has returned; the daemon lives on
        assert "started" in (node.root / "var/log/nvidia-persistenced.log").read_text()
        assert node.persistence_mode() == 1
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not _running(pid), "persistenced gone")
        assert not pid_file(node.root, PERSISTENCED).exists()
        assert node.persistence_mode() == 0

    def test_uvm_option_needs_branch_550(self, node: Node, tmp_path: Path) -> None:
        old = node.run(PERSISTENCED, "--persistence-mode", "--uvm-persistence-mode")
        assert old.returncode == 1
        assert 'Unrecognized option: "--uvm-persistence-mode"' in old.stderr
        newer = tmp_path / "bin550"
        write_daemon_standins(newer, version="550.54.15")
        proc = subprocess.Popen([str(newer / PERSISTENCED), "--persistence-mode",
                                 "--uvm-persistence-mode", "-f"], text=True)
        node.procs.append(proc)
        wait_for(lambda: pid_file(node.root, PERSISTENCED).exists(), "pid file")
        assert node.pid(PERSISTENCED) == proc.pid  # -f: the foreground process itself
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE_S) == 0

    def test_fail_at_start(self, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_PERSISTENCED_FAIL", "start")
        assert node.run(PERSISTENCED, "--persistence-mode").returncode == 1
        assert not pid_file(node.root, PERSISTENCED).exists()
        assert node.persistence_mode() == 0


class TestSafety:
    def test_refuses_without_a_root(self, node: Node, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("FAKE_DAEMON_ROOT")
        result = node.run(PERSISTENCED, "--persistence-mode")
        assert result.returncode == 2 and "FAKE_DAEMON_ROOT is not set" in result.stderr
        assert not node.persistence.exists()

    def test_every_start_is_recorded(self, node: Node) -> None:
        node.run(FM, "-c", "/nonexistent.cfg")
        assert [(s["name"], s["argv"]) for s in started(node.root)] == [
            (FM, ["-c", "/nonexistent.cfg"])]
