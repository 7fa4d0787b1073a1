"""`gpu-node-installer compat`: yes/no with the reason, exit codes, the loaded driver."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import node_args

from installer.cli import cli

NodeMaker = Callable[[str], Path]
NVRM_535 = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  "
            "Release Build  (dvs-builder@U16-I3-B03-4-1)  Wed Jul  2 18:38:54 UTC 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


@pytest.fixture(autouse=True)
def _termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Failures also go to the termination log: keep it out of the CI host's /dev."""
    log = tmp_path / "termination-log"
    monkeypatch.setenv("TERMINATION_LOG", str(log))
    return log


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["compat", *args])
    return result.exit_code, result.stdout, result.stderr


def _with_loaded_driver(root: Path, nvrm: str = NVRM_535) -> Path:
    version = root / "proc" / "driver" / "nvidia" / "version"
    version.parent.mkdir(parents=True)
    version.write_text(nvrm, encoding="utf-8")
    return root


class TestWithDriverFlag:
    def test_seed_versions_are_compatible(self) -> None:
        code, out, _ = _invoke("--cuda", "10.1", "--driver", "418.67")
        assert code == 0
        assert out.startswith("compatible: yes (CUDA 10.1 on driver 418.67)")
        assert "needs driver >= 418.39" in out

    def test_json_contract(self) -> None:
        code, out, _ = _invoke("--cuda", "12.4", "--driver", "535.261.03", "--output", "json")
        data = json.loads(out)
        assert code == 0
        assert data == {
            "cuda": "12.4", "driver": "535.261.03", "compatible": True,
            "mode": "minor-version-compatibility", "release": "CUDA 12.4 GA",
            "minimum_driver": "550.54.14", "minor_version_floor": "525.60.13",
            "max_cuda": "12.2", "reason": data["reason"]}

    def test_incompatible_prints_verdict_and_exits_14(self, _termination_log: Path) -> None:
        code, out, err = _invoke("--cuda", "12.4", "--driver", "470.82.01", "--output", "json")
        assert code == 14
        assert json.loads(out)["compatible"] is False
        assert err.strip() == ("error(incompatible): driver 470.82.01 does not run CUDA 12.4; "
                               "fix: install driver 550.54.14 or newer, or build the "
                               "application with an older CUDA toolkit")
        assert not _termination_log.exists()  # run by hand: no pod's last word

    def test_exact_minimum_and_one_below(self) -> None:
        assert _invoke("--cuda", "10.2", "--driver", "440.33")[0] == 0
        assert _invoke("--cuda", "10.2", "--driver", "440.32")[0] == 14

    def test_needs_no_host_mounts(self) -> None:
        code, _, _ = _invoke("--cuda", "12.2", "--driver", "535.261.03",
                             "--host-root", "/nonexistent-host-root")
        assert code == 0


class TestMalformed:
    @pytest.mark.parametrize("args", [
        ("--cuda", "12", "--driver", "535.261.03"),
        ("--cuda", "12.4", "--driver", "535"),
        ("--cuda", "twelve", "--driver", "535.261.03"),
        ("--cuda", "14.0", "--driver", "535.261.03")])
    def test_exit_2_with_one_line(self, args: tuple[str, ...]) -> None:
        code, out, err = _invoke(*args)
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1 and err.startswith("error(config): ")

    def test_cuda_is_required(self) -> None:
        code, _, err = _invoke("--driver", "535.261.03")
        assert code == 2 and "--cuda" in err


class TestLoadedDriver:
    def test_uses_the_driver_loaded_on_the_node(self, make_node: NodeMaker) -> None:
        root = _with_loaded_driver(make_node("gke-cos-a100x8"))
        code, out, _ = _invoke("--cuda", "12.2", *node_args(root), "--output", "json")
        data = json.loads(out)
        assert code == 0 and data["driver"] == "535.261.03" and data["mode"] == "native"

    def test_loaded_driver_too_old(self, make_node: NodeMaker) -> None:
        root = _with_loaded_driver(make_node("gke-ubuntu-t4"))
        code, out, _ = _invoke("--cuda", "13.0", *node_args(root))
        assert code == 14 and "compatible: no (CUDA 13.0 on driver 535.261.03)" in out

    def test_no_loaded_driver_exits_2(self, make_node: NodeMaker) -> None:
        code, out, err = _invoke("--cuda", "12.4", *node_args(make_node("debian12-l4")))
        assert code == 2 and out == ""
        assert "no NVIDIA driver is loaded" in err and "--driver" in err

    def test_on_a_workstation_the_fix_is_driver(self) -> None:
        """No node mounted and no --driver: the line leads with --driver, the likely fix."""
        code, out, err = _invoke("--cuda", "12.4", "--host-root", "/nonexistent-host-root")
        assert code == 2 and out == ""
        (line,) = err.strip().splitlines()
        assert line.startswith("error(config): no --driver given, and no node's loaded "
                               "driver to check: --host-root /nonexistent-host-root")
        assert line.endswith("fix: pass --driver VERSION to check a driver version, or point "
                             "--host-root at a node's filesystem")

    def test_malformed_cuda_refused_before_reading_the_node(self) -> None:
        code, _, err = _invoke("--cuda", "12", "--host-root", "/nonexistent-host-root")
        assert code == 2 and "--cuda '12'" in err


class TestStatus:
    """`status` shows the newest CUDA toolkit the loaded driver runs."""

    def test_json_and_text(self, make_node: NodeMaker) -> None:
        root = _with_loaded_driver(make_node("gke-cos-a100x8"))
        result = CliRunner().invoke(cli, ["status", *node_args(root), "--output", "json"])
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["cuda"] == {
            "driver": "535.261.03", "max_toolkit": "12.2", "minor_version_compat_major": 12}
        text = CliRunner().invoke(cli, ["status", *node_args(root)]).stdout
        assert "CUDA:            up to CUDA 12.2 (any 12.x through minor version " in text

    def test_no_driver_loaded(self, make_node: NodeMaker) -> None:
        result = CliRunner().invoke(cli, ["status", *node_args(make_node("debian12-l4"))])
        assert result.exit_code == 0, result.stderr
        assert "CUDA:            no driver loaded" in result.stdout
