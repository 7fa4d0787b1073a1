"""The settings as click options: each command shows the settings it reads, one line each.

A setting another command reads stays accepted (hidden), so no script breaks. Options are
typed from the settings table (a fixed set: `click.Choice`; a range: `IntRange`/`FloatRange`)
for help and shell completion only: the types hand click's text through unchanged, and
`installer.config.load_config` stays the one validation (env vars included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from installer.config import SETTINGS, Setting
from installer.config.values import CHOICES, RANGES, Bounds

F = TypeVar("F", bound=Callable[..., Any])

# A command's help stays within this many lines: past it, the settings' flags are packed.
HELP_LINES = 60


class _AsGiven:
    """Mixin: the settings table parses the value, not click (same messages as env vars)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        return value


class SettingChoice(_AsGiven, click.Choice):  # type: ignore[type-arg]
    """A setting's fixed values: shown in help, offered by completion."""


class SettingIntRange(_AsGiven, click.IntRange):
    """A setting's whole-number range, shown in help."""


class SettingFloatRange(_AsGiven, click.FloatRange):
    """A setting's range of numbers, shown in help."""


def _bounds_text(bounds: Bounds) -> str:
    def num(value: float) -> str:
        return str(int(value)) if float(value).is_integer() else str(value)

    low = num(bounds.low or 0)
    if bounds.high is None:
        return f"{low}<N" if bounds.low_open else f"{low}<=N"
    return f"{low}<N<={num(bounds.high)}" if bounds.low_open else f"{low}..{num(bounds.high)}"


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def param_type(setting: Setting) -> tuple[click.ParamType[Any] | None, str]:
    """The option's click type and the metavar its help line shows."""
    if setting.parse in CHOICES:
        choices = CHOICES[setting.parse]
        return SettingChoice(choices, case_sensitive=False), "|".join(choices)
    if setting.parse in RANGES:
        bounds = RANGES[setting.parse]
        if bounds.integer:
            return (SettingIntRange(min=_whole(bounds.low), max=_whole(bounds.high)),
                    _bounds_text(bounds))
        return (SettingFloatRange(min=bounds.low, max=bounds.high, min_open=bounds.low_open),
                _bounds_text(bounds))
    return None, "TEXT"


class SettingOption(click.Option):
    """One setting's option; its help record is the compact line of `NodeCommand`."""

    def __init__(self, param_decls: list[str], *, setting: Setting, shown: bool) -> None:
        kind, self.values_text = param_type(setting)
        super().__init__(param_decls, is_flag=setting.is_flag, default=None,
                         multiple=setting.multiple, type=None if setting.is_flag else kind,
                         hidden=not shown, help=setting.help)
        self.setting = setting

    def compact(self) -> tuple[str, str]:
        """(flag and values, env var and help) for one help line."""
        flag = self.setting.flag if self.is_flag else f"{self.setting.flag} {self.values_text}"
        env = f"${self.setting.envvar} " if self.setting.envvar else ""
        return flag, f"{env}{self.setting.help}"


class NodeCommand(click.Command):
    """A node command: its own options as usual, then its settings one line each.

    The settings' options (every setting, on every node command) are built the first time
    the command's parameters are asked for (to parse, complete or show help): a run builds
    its own command's only, not those of every command at import."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._settings_of: str | None = getattr(kwargs.get("callback"), SETTINGS_OF, None)
        super().__init__(*args, **kwargs)

    @property
    def params(self) -> list[click.Parameter]:
        if self._settings_of is not None:
            command, self._settings_of = self._settings_of, None
            self._params.extend(setting_options(command))
        return self._params

    @params.setter
    def params(self, value: list[click.Parameter]) -> None:
        self._params = value

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own = [record for p in self.get_params(ctx) if not isinstance(p, SettingOption)
               if (record := p.get_help_record(ctx)) is not None]
        settings = [p.compact() for p in self.get_params(ctx)
                    if isinstance(p, SettingOption) and not p.hidden]
        if own:
            with formatter.section("Options"):
                formatter.write_dl(own)
        if settings:
            room = HELP_LINES - "".join(formatter.buffer).count("\n") - 3  # heading, epilog
            with formatter.section("Settings (flag, env var; full text: docs/reference.md)"):
                width = formatter.width - formatter.current_indent
                for line in _setting_lines(settings, width, packed=len(settings) > room):
                    formatter.write(f"{'':>{formatter.current_indent}}{line}\n")


def _setting_lines(settings: list[tuple[str, str]], width: int, *, packed: bool) -> list[str]:
    """One line per setting (cut to the width), or the flags packed when there are many."""
    if packed:
        lines, line = [], ""
        for flag, _ in settings:
            token = flag.replace(" ", "=", 1)
            if line and len(line) + 2 + len(token) > width:
                lines.append(line)
                line = ""
            line = f"{line}  {token}" if line else token
        return [*lines, line] if line else lines
    column = min(max(len(flag) for flag, _ in settings), 24) + 2
    out = []
    for flag, text in settings:
        line = f"{flag:<{column}}{text}" if len(flag) <= column - 2 else f"{flag}  {text}"
        out.append(line if len(line) <= width else line[:width - 1] + "…")
    return out


def command_name(fn: Any) -> str:
    """The command a function becomes (`wait_ready` -> `wait-ready`, `cdi_command` -> `cdi`)."""
    return str(fn.__name__).removesuffix("_command").replace("_", "-")


SETTINGS_OF = "_gni_settings_of"  # on a command's callback: whose settings it takes


def add_settings(fn: F) -> F:
    """Every setting as an option of the command `fn` becomes, shown only where it reads it
    (`NodeCommand` builds them when they are first needed)."""
    setattr(fn, SETTINGS_OF, command_name(fn))
    return fn


def setting_options(command: str) -> list[click.Parameter]:
    """Every setting's option for `command`, in the table's order."""
    return [SettingOption([setting.flag, setting.name], setting=setting,
                          shown=command in setting.commands) for setting in SETTINGS]
