"""The command line: detect output, config errors, exit codes, termination log, start-up cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import node_args

from installer import __version__
from installer.cli import cli
from installer.node.host import Roots
from installer.testing import SAMPLE_NODES

NodeMaker = Callable[[str], Path]


@pytest.fixture(autouse=True)
def _termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Failures before the config loads go to $TERMINATION_LOG: never the CI host's /dev."""
    monkeypatch.setenv("TERMINATION_LOG", str(tmp_path / "termination-log"))


def _invoke(args: list[str], env: dict[str, str] | None = None,
            obj: dict[str, object] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, args, env=env, obj=obj)
    return result.exit_code, result.stdout, result.stderr


class TestDetect:
    def test_json_for_hgx_a100(self, make_node: NodeMaker) -> None:
        code, out, _ = _invoke(["detect", *node_args(make_node("gke-cos-a100x8")),
                                "--output", "json"])
        assert code == 0
        data = json.loads(out)
        assert len(data["gpus"]) == 8 and len(data["nvswitches"]) == 6
        assert all(g["name"] == "A100 SXM4 40GB" for g in data["gpus"])

    def test_text_report(self, make_node: NodeMaker) -> None:
        code, out, _ = _invoke(["detect", *node_args(make_node("al2023-nouveau-vfio"))])
        assert code == 0
        assert "GPUs:            2" in out and "driver=nouveau" in out
        assert "blacklist nouveau" in out

    def test_no_gpu_node_exits_zero_with_clear_result(self, make_node: NodeMaker) -> None:
        code, out, _ = _invoke(["detect", *node_args(make_node("debian12-no-gpu"))])
        assert code == 0 and "no NVIDIA GPU on this node" in out

    def test_logs_one_json_event_on_stderr(self, make_node: NodeMaker) -> None:
        code, _, err = _invoke(["detect", *node_args(make_node("gke-ubuntu-t4")),
                                "--output", "json", "--log-format", "json"])
        events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        assert code == 0 and len(events) == 1
        assert events[0]["event"] == "stage finished" and events[0]["stage"] == "detect"
        assert events[0]["severity"] == "INFO" and events[0]["duration_ms"] >= 0


class TestErrors:
    def test_bad_env_exits_2_with_one_line(self, make_node: NodeMaker) -> None:
        code, out, err = _invoke(["detect", *node_args(make_node("gke-ubuntu-t4"))],
                                 env={"NVIDIA_DRIVER_VERSION": "5 3 5"})
        assert code == 2 and out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "NVIDIA_DRIVER_VERSION" in lines[0]

    def test_missing_host_root(self, tmp_path: Path) -> None:
        code, _, err = _invoke(["detect", "--host-root", str(tmp_path / "nope")])
        assert code == 2 and "--host-root" in err

    def test_unknown_flag_is_usage_error(self) -> None:
        code, _, err = _invoke(["detect", "--no-such-flag"])
        assert code == 2 and "No such option" in err

    @pytest.mark.parametrize("command", ["fetch", "detect"])
    def test_failure_written_to_termination_log(self, make_node: NodeMaker, tmp_path: Path,
                                                command: str) -> None:
        """`detect` is run by hand: its failure is no pod's last word."""
        root = make_node("gke-ubuntu-t4")
        (root / "etc" / "os-release").write_text("this is not os-release\n")
        log = tmp_path / "termination-log"
        code, _, err = _invoke([command, *node_args(root), "--termination-log", str(log)])
        assert code == 4
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"error(unsupported-node): [{command}] /etc/os-release line 1")
        if command == "detect":
            assert not log.exists()
        else:
            assert log.read_text().strip() == last

    def test_unexpected_exception_has_no_traceback(self, make_node: NodeMaker) -> None:
        def broken(_roots: Roots) -> object:
            raise RuntimeError("boom")

        root = make_node("gke-ubuntu-t4")
        code, _, err = _invoke(["detect", *node_args(root)], obj={"host_factory": broken})
        assert code == 1
        assert "error(internal): RuntimeError: boom" in err and "Traceback" not in err

    def test_debug_shows_traceback(self, make_node: NodeMaker) -> None:
        def broken(_roots: Roots) -> object:
            raise RuntimeError("boom")

        root = make_node("gke-ubuntu-t4")
        code, _, err = _invoke(["detect", *node_args(root), "--debug"],
                               obj={"host_factory": broken})
        assert code == 1 and "Traceback" in err


class TestProcess:
    def test_console_script_subprocess(self, make_node: NodeMaker) -> None:
        script = Path(sys.executable).with_name("gpu-node-installer")
        assert script.exists(), "install the package first: pip install -e ."
        done = subprocess.run([str(script), "detect", *node_args(make_node("rocky9-h100x8")),
                               "--output", "json"], capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert len(json.loads(done.stdout)["gpus"]) == 8
        assert json.loads(done.stderr.splitlines()[-1])["stage"] == "detect"

    def test_python_dash_m_and_version(self) -> None:
        done = subprocess.run([sys.executable, "-m", "installer", "--version"],
                              capture_output=True, text=True, timeout=60, check=True)
        assert __version__ in done.stdout

    def test_env_error_via_subprocess(self, make_node: NodeMaker) -> None:
        env = {**os.environ, "NVIDIA_DRIVER_VERSION": "5 3 5"}
        done = subprocess.run([sys.executable, "-m", "installer", "detect",
                               *node_args(make_node("gke-ubuntu-t4"))],
                              capture_output=True, text=True, env=env, timeout=60,
                              check=False)
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and "NVIDIA_DRIVER_VERSION" in done.stderr

    def test_sample_node_help_names_the_root_flags(self, tmp_path: Path) -> None:
        done = subprocess.run([sys.executable, "-m", "installer.testing", "--help"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0 and done.stderr == ""
        assert "--host-root DIR --proc-root DIR/proc --sys-root DIR/sys" in done.stdout
        assert "  gke-cos-a100x8\n" in done.stdout
        wrong = subprocess.run([sys.executable, "-m", "installer.testing", "no-such-node",
                                str(tmp_path / "n")], capture_output=True, text=True,
                               timeout=60, check=False)
        assert wrong.returncode == 2 and wrong.stdout == ""
        assert wrong.stderr.startswith("usage: python -m installer.testing NODE DIR")
        assert not (tmp_path / "n").exists()

    @pytest.mark.parametrize("node", sorted(SAMPLE_NODES))
    def test_a_sample_node_without_a_driver_binds_no_gpu_to_nvidia(self, node: str,
                                                                   make_node: NodeMaker
                                                                   ) -> None:
        """As on a real node: no NVIDIA module loaded, no GPU bound to `nvidia` (what
        `make sample` shows first)."""
        code, out, _ = _invoke(["detect", *node_args(make_node(node)), "--output", "json"])
        report = json.loads(out)
        assert code == 0 and report["loaded_driver"]["version"] is None
        assert all(gpu["driver"] != "nvidia" for gpu in report["gpus"]), report["gpus"]

    @pytest.mark.parametrize("heavy", ["requests", "pynvml"])
    def test_cli_import_stays_light(self, heavy: str) -> None:
        """Start-up time is a feature: the CLI must not import download or NVML code."""
        code = f"import sys, installer.cli; print('{heavy}' in sys.modules)"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, check=True)
        assert done.stdout.strip() == "False"
