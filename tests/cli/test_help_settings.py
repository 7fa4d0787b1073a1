"""Help fits the command: each node command shows only the settings it reads (one line each
or packed, at most 60 lines of help), the rest stay accepted; typed options show their values
and completion offers them; the settings table still validates flags and env vars alike.

The map is proved by running every command on a sample node with a Config that records each
field read (handed in through the CLI's `config_view` seam): every field read must be one of
the settings the command shows."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.shell_completion import ShellComplete
from click.testing import CliRunner
from helpers import node_args
from packages import KERNEL, write_index, write_package

from installer.cli import cli
from installer.config import SETTINGS, Config
from installer.config.readers import NODE, PREFLIGHT

NodeMaker = Callable[[str], Path]
FIELDS = frozenset(f.name for f in dataclasses.fields(Config))
POD = """apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers:
  - name: c
    image: nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04
    resources: {limits: {nvidia.com/gpu: 1}}
"""


def shown(command: str) -> set[str]:
    return {s.name for s in SETTINGS if command in s.commands}


def recording(reads: set[str]) -> Callable[[Config], Config]:
    """A `config_view` whose Config notes every field read (copies made by dataclasses'
    `replace` read every field and are not the command's reads)."""

    class Recording(Config):
        def __getattribute__(self, name: str) -> Any:
            if name in FIELDS and not sys._getframe(1).f_code.co_filename.endswith(
                    "dataclasses.py"):
                reads.add(name)
            return object.__getattribute__(self, name)

    def view(config: Config) -> Config:
        return Recording(**{name: object.__getattribute__(config, name) for name in FIELDS})

    return view


def _runs(root: Path, tmp: Path) -> dict[str, list[list[str]]]:
    """Each node command with arguments that take it as far as a sample node allows."""
    repo = tmp / "repo"
    write_package(repo, kernel=KERNEL)
    write_index(repo)
    pod = tmp / "pod.yaml"
    pod.write_text(POD)
    fetching = ["--mirror", repo.as_uri(), "--driver-version", "535.261.03"]
    pools = tmp / "map.yaml"
    pools.write_text('- {selector: {pool: a}, version: "535"}\n')
    mapped = ["--driver-version-map", str(pools), "--node-name", "n1"]
    return {
        "detect": [[]], "status": [[], mapped], "unload": [[]], "verify": [[]], "signal": [[]],
        "cdi": [[]], "uninstall": [["--keep-cache"], []],
        "agent": [["--probe"], ["--once", "--metrics-port", "0"]],
        "compat": [["--cuda", "12.4"]], "check-pod": [[str(pod), "--here"]],
        "partition": [["--dry-run"], []], "wait-ready": [["--timeout", "0.1"]],
        "versions": [fetching, [*fetching, *mapped]], "fetch": [fetching], "load": [fetching],
        "stage": [fetching, ["--rollback"]], "install": [fetching],
        "prepare": [[*fetching, "--kernel", KERNEL], [*fetching, *mapped, "--kernel", KERNEL]],
    }


@pytest.fixture(scope="module")
def reads_by_command(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    from installer.testing import SAMPLE_NODES, build_node

    tmp = tmp_path_factory.mktemp("reads")
    root = build_node(tmp / "node", SAMPLE_NODES["debian12-l4"])
    found: dict[str, set[str]] = {}
    for command, runs in _runs(root, tmp).items():
        found[command] = set()
        for args in runs:
            CliRunner().invoke(cli, [command, *args, *node_args(root)],
                               obj={"config_view": recording(found[command])},
                               env={"TERMINATION_LOG": str(tmp / "termination-log")})
    return found


def test_every_node_command_is_run(reads_by_command: dict[str, set[str]]) -> None:
    assert set(reads_by_command) == NODE


@pytest.mark.parametrize("command", sorted(NODE))
def test_a_command_reads_only_the_settings_it_shows(
        command: str, reads_by_command: dict[str, set[str]]) -> None:
    reads = reads_by_command[command]
    assert {"host_root", "log_format"} <= reads  # the recorder saw the run
    assert reads <= shown(command), f"{command} reads {sorted(reads - shown(command))}"


def _help(command: str) -> str:
    done = CliRunner().invoke(cli, [command, "--help"])
    assert done.exit_code == 0, done.output
    return done.stdout


def _flags_in_help(text: str) -> set[str]:
    section = text.split("Settings (", 1)[1] if "Settings (" in text else ""
    return {flag for line in section.splitlines()[1:]
            for flag in re.findall(r"(?:^ *|  )(--[a-z-]+)", line)}


@pytest.mark.parametrize("command", sorted(NODE | PREFLIGHT))
def test_help_fits_and_lists_exactly_the_settings_read(command: str) -> None:
    text = _help(command)
    assert len(text.splitlines()) <= 60
    assert _flags_in_help(text) == {s.flag for s in SETTINGS if command in s.commands}


def test_compact_lines_fit_a_terminal() -> None:
    assert all(len(line) <= 80 for c in NODE for line in _help(c).splitlines()
               if line.startswith("  --"))


def test_a_setting_not_shown_is_still_accepted(make_node: NodeMaker) -> None:
    assert "--metrics-port" not in _help("detect")
    done = CliRunner().invoke(cli, ["detect", "--metrics-port", "9421",
                                    *node_args(make_node("gke-ubuntu-t4"))])
    assert done.exit_code == 0, done.output


def test_help_shows_a_choice_and_a_range() -> None:
    packed, one_each = _help("install"), _help("fetch")
    assert "--flavour=auto|open|proprietary" in packed
    assert "--cache-keep=1..100" in packed and "--download-parallel=1..32" in packed
    assert re.search(r"--log-level debug\|info\|warning\|error +\$LOG_LEVEL", one_each)
    assert re.search(r"--cache-keep 1\.\.100 +\$DRIVER_CACHE_KEEP packages kept", one_each)


def test_the_settings_table_still_validates_a_typed_flag(make_node: NodeMaker) -> None:
    root = make_node("gke-ubuntu-t4")
    for args in (["--flavour", "closed"], ["--cache-keep", "0"]):
        done = CliRunner().invoke(cli, ["versions", *args, *node_args(root)])
        assert done.exit_code == 2
        assert f"{args[0]}={args[1]!r} is invalid" in done.stderr
        assert "Usage:" not in done.stderr  # ours, not click's


def test_an_env_var_of_a_hidden_setting_is_still_validated(make_node: NodeMaker) -> None:
    done = CliRunner().invoke(cli, ["detect", *node_args(make_node("gke-ubuntu-t4"))],
                              env={"METRICS_PORT": "70000"})
    assert done.exit_code == 2 and "METRICS_PORT='70000' is invalid" in done.stderr


def test_a_choice_is_case_blind_as_the_env_var(make_node: NodeMaker) -> None:
    done = CliRunner().invoke(cli, ["detect", "--log-level", "WARNING",
                                    *node_args(make_node("gke-ubuntu-t4"))])
    assert done.exit_code == 0, done.output


def _complete(args: list[str], incomplete: str) -> list[str]:
    completion = ShellComplete(cli, {}, "gpu-node-installer", "_GPU_NODE_INSTALLER_COMPLETE")
    return [item.value for item in completion.get_completions(args, incomplete)]


def test_completion_offers_a_choice_options_values() -> None:
    assert _complete(["install", "--flavour"], "") == ["auto", "open", "proprietary"]
    assert _complete(["install", "--upgrade-policy"], "e") == ["evict"]
    assert _complete(["agent", "--mig-strategy"], "") == ["single", "mixed"]  # hidden too


def test_completion_offers_only_the_shown_settings() -> None:
    offered = set(_complete(["detect"], "--"))
    assert "--host-root" in offered and "--metrics-port" not in offered


def test_top_level_exit_codes_keep_one_line_each() -> None:
    text = CliRunner().invoke(cli, ["--help"]).stdout
    table = text.split("Exit codes:", 1)[1]
    assert "\n      0  success\n" in table and "\n      2  bad flag" in table
    assert "\n     13  another installer run holds the lock\n" in table


def test_every_setting_has_readers() -> None:
    assert all(s.commands and s.commands <= NODE | PREFLIGHT for s in SETTINGS)


def test_preflight_reads_only_the_settings_it_shows(tmp_path: Path) -> None:
    """preflight reads no node: no root or install-dir setting, only the version rules,
    the mirrors, the downloads and the logs (it runs where no /host exists)."""
    repo = tmp_path / "repo"
    write_package(repo, kernel=KERNEL)
    write_index(repo)
    pools = tmp_path / "map.yaml"
    pools.write_text('- {selector: {pool: a}, version: "535"}\n')
    reads: set[str] = set()
    done = CliRunner().invoke(cli, ["preflight", "--kernel", f"{KERNEL},x86_64", "--mirror",
                                    repo.as_uri(), "--driver-version-map", str(pools)],
                              obj={"config_view": recording(reads)},
                              env={"TERMINATION_LOG": str(tmp_path / "termination-log")})
    assert done.exit_code == 0, done.output
    assert {"mirrors", "driver_version", "log_format", "download_deadline"} <= reads
    assert reads <= shown("preflight"), sorted(reads - shown("preflight"))
    assert not {"host_root", "install_dir", "cache_dir"} & shown("preflight")
