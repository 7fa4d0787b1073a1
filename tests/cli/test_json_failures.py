"""`-o json` failures: every command that takes `--output json` prints a failure as one JSON
object on stdout (the line, the exit code, the slug, the message and the fix), so a script
needs no parsing of stderr; a command that printed its report first keeps it the only one."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from helpers import node_args

from installer.cli import cli
from installer.errors import error_table
from installer.pipeline.prepare import PrepareResult

NodeMaker = Callable[[str], Path]
CODES = {cls.code for cls in error_table()}


def json_commands(group: click.Group = cli, prefix: tuple[str, ...] = ()
                  ) -> Iterator[tuple[str, ...]]:
    """Every command with an `--output` choice of json, as its words."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from json_commands(command, (*prefix, name))
        elif any(p.name == "output" and "json" in getattr(p.type, "choices", ())
                 for p in command.params):
            yield (*prefix, name)


def failing(words: tuple[str, ...], node: list[str], tmp_path: Path
            ) -> tuple[list[str], int, str]:
    """A failing run of the command: its arguments, the exit code and the slug expected."""
    if words == ("package", "build"):
        return [*words, "--modules", str(tmp_path), "--kernel-release", "6.1.0"], 2, "config"
    if words == ("package", "index"):
        return [*words, str(tmp_path), "--alias", "nope"], 2, "config"
    if words == ("compat",):
        return [*words, "--cuda", "nope", "--driver", "535.261.03"], 2, "config"
    if words == ("check-pod",):
        return [*words, str(tmp_path / "absent.yaml")], 2, "config"
    return [*words, *node, "--lock-timeout", "-1"], 2, "config"


def test_every_json_command_is_covered() -> None:
    commands = set(json_commands())
    assert {("install",), ("package", "build"), ("wait-ready",), ("check-pod",)} <= commands
    assert len(commands) >= 18


@pytest.mark.parametrize("words", sorted(json_commands()), ids=" ".join)
@pytest.mark.parametrize("flag", ["-o", "--output"])
def test_a_failure_is_one_json_object(words: tuple[str, ...], flag: str,
                                      make_node: NodeMaker, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERMINATION_LOG", str(tmp_path / "termination-log"))
    args, code, slug = failing(words, node_args(make_node("gke-ubuntu-t4")), tmp_path)
    done = CliRunner().invoke(cli, [*args, flag, "json"])
    assert done.exit_code == code, (done.stdout, done.stderr)
    failure = json.loads(done.stdout)
    result = set(PrepareResult("r").to_dict()) if words == ("prepare",) else set()  # its own
    assert set(failure) == {"error", "exit_code", "slug", "stage", "message", "fix"} | result
    assert failure["exit_code"] == code in CODES and failure["slug"] == slug
    assert failure["error"] == done.stderr.strip().splitlines()[-1]
    assert failure["error"].startswith(f"error({slug}): ") and failure["fix"]
    assert failure["message"] in failure["error"]


def test_text_output_prints_no_object(make_node: NodeMaker, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERMINATION_LOG", str(tmp_path / "termination-log"))
    done = CliRunner().invoke(cli, ["status", *node_args(make_node("gke-ubuntu-t4")),
                                    "--lock-timeout", "-1"])
    assert done.exit_code == 2 and done.stdout == ""
    assert done.stderr.startswith("error(config): ")


def test_a_report_printed_first_stays_the_only_json(tmp_path: Path) -> None:
    """check-pod prints its verdict, then fails with 14: stdout holds that verdict alone."""
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n"
                   "  - name: c\n    image: cuda\n    resources: {limits: "
                   "{nvidia.com/gpu: 'two'}}\n")
    done = CliRunner().invoke(cli, ["check-pod", str(pod), "-o", "json"])
    assert done.exit_code == 14, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert "exit_code" not in report
    assert done.stderr.strip().splitlines()[-1].startswith("error(")


def test_a_usage_error_is_a_json_object_too(tmp_path: Path) -> None:
    """click refuses `--modules` (no such folder) before the command runs: the object still
    comes, with the documented code of a bad flag; click's usage text stays on stderr."""
    done = CliRunner().invoke(cli, ["package", "build", "--modules", str(tmp_path / "none"),
                                    "-o", "json"])
    assert done.exit_code == 2
    failure = json.loads(done.stdout)
    assert failure["exit_code"] == 2 and failure["slug"] == "config"
    assert "'--modules'" in failure["message"] and "does not exist" in failure["message"]
    assert "Usage:" in done.stderr
