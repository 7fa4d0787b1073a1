"""Markdown tables generated from the code, so docs/reference.md cannot drift from it.

Commands come from walking the click group (a new command appears here by itself, and the
manual's test then asks for its section), settings from `installer.config.SETTINGS`, exit
codes from `installer.errors.error_table()`.
"""

from __future__ import annotations

import click

from installer.config import SETTINGS
from installer.config.readers import NODE
from installer.errors import error_table

_SETTING_FLAGS = frozenset(s.flag for s in SETTINGS)


def commands() -> list[tuple[str, click.Command]]:
    """Every runnable command by its full path (`package build`), in name order."""
    from installer.cli import cli

    found: list[tuple[str, click.Command]] = []

    def walk(group: click.Group, prefix: str) -> None:
        for name in sorted(group.commands):
            command = group.commands[name]
            if isinstance(command, click.Group):
                walk(command, f"{prefix}{name} ")
            else:
                found.append((f"{prefix}{name}", command))

    walk(cli, "")
    return found


def takes_settings(command: click.Command) -> bool:
    """Whether the command takes every node setting (flag or environment variable)."""
    flags = {flag for param in command.params for flag in param.opts}
    return flags >= _SETTING_FLAGS


def own_params(command: click.Command) -> list[click.Parameter]:
    """The command's arguments and options other than the node settings and --help (a
    command that does not take the settings may still reuse a flag name: `package build
    --driver-version` is its own option)."""
    settings = takes_settings(command)
    return [p for p in command.params
            if not (settings and set(p.opts) & _SETTING_FLAGS) and "--help" not in p.opts]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _summary(command: click.Command) -> str:
    return _cell((command.help or "").strip().split("\n\n")[0])


def _name(param: click.Parameter) -> str:
    """As code: `FILE`, or each spelling of an option (`-o`/`--output`)."""
    if isinstance(param, click.Argument):
        return f"`{param.metavar or param.name or ''}`"
    return "/".join(f"`{opt}`" for opt in param.opts)


def commands_table() -> str:
    """One row per command: its own arguments and options, settings, what it does."""
    rows = ["| command | arguments and options (besides the settings) | settings | what |",
            "|---|---|---|---|"]
    for path, command in commands():
        params = _cell(" ".join(_name(p) for p in own_params(command))) or "none"
        settings = f"{_reads(path)} of {len(SETTINGS)}" if takes_settings(command) else "none"
        rows.append(f"| `{path}` | {params} | {settings} | {_summary(command)} |")
    return "\n".join(rows) + "\n"


def _accepted(param: click.Parameter) -> str:
    kind = param.type
    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    if isinstance(kind, click.Choice):
        return " | ".join(f"`{c}`" for c in kind.choices)
    if param.metavar:
        return f"`{param.metavar}`"
    if isinstance(kind, click.IntRange | click.FloatRange):
        number = "an integer" if isinstance(kind, click.IntRange) else "a number"
        bounds = [f">= {kind.min}" if kind.min is not None else "",
                  f"<= {kind.max}" if kind.max is not None else ""]
        return " ".join([number, *filter(None, bounds)])
    if isinstance(kind, click.Path):
        return "a directory" if not kind.file_okay else "a file" if not kind.dir_okay else "a path"
    return kind.name


def _default(param: click.Parameter) -> str:
    default = param.default
    if default is None or default in ((), False) or type(default).__name__ == "Sentinel":
        return ""
    return f"`{default}`"


def command_options_table() -> str:
    """Every argument and option of every command (settings apart), each once, with the
    commands that take it: `--output` is one row, not one per command."""
    by_param: dict[tuple[str, str, str, str, str], list[str]] = {}
    for path, command in commands():
        for param in own_params(command):
            env = param.envvar if isinstance(param.envvar, str) else ""
            help_text = getattr(param, "help", None) or (
                "positional argument" if isinstance(param, click.Argument) else "")
            key = (_name(param), _cell(help_text), env, _accepted(param), _default(param))
            by_param.setdefault(key, []).append(path)
    rows = ["| option | commands | env | accepted | default | what |",
            "|---|---|---|---|---|---|"]
    for (name, help_text, env, accepted, default), paths in sorted(by_param.items()):
        where = ", ".join(f"`{p}`" for p in paths)
        cells = [name, where, f"`{env}`" if env else "", accepted, default]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + f" | {help_text} |")
    return "\n".join(rows) + "\n"


def _reads(command: str) -> int:
    """How many settings `command` reads (and its `--help` shows)."""
    return sum(command in s.commands for s in SETTINGS)


def _readers(commands: frozenset[str]) -> str:
    return "all" if commands == NODE else ", ".join(f"`{c}`" for c in sorted(commands))


def settings_table() -> str:
    """Flag, environment variable, default, accepted values and readers of every setting."""
    rows = ["| flag | env | default | accepted | read by | what |", "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        default = f"`{s.default}`" if s.default else "derived"
        rows.append(f"| `{s.flag}` | `{s.envvar or ''}` | {default} | {_cell(s.accepted)} "
                    f"| {_readers(s.commands)} | {_cell(s.help)} |")
    return "\n".join(rows) + "\n"


def exit_code_table() -> str:
    """Exit code, slug and meaning of every failure class."""
    rows = ["| code | slug | meaning | usual fix |", "|---|---|---|---|", "| 0 | | success | |"]
    for cls in error_table():
        rows.append(f"| {cls.code} | `{cls.slug}` | {_cell(cls.summary)} "
                    f"| {_cell(cls.default_remedy)} |")
    return "\n".join(rows) + "\n"


# The generated blocks of docs/reference.md, by marker name.
BLOCKS = {"commands-table": commands_table, "command-options": command_options_table,
          "settings-table": settings_table, "exit-codes": exit_code_table}
