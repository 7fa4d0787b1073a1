"""The shape of one setting, and the small parsers that several setting groups share.

Kept apart from the settings table so that a group of settings (the upgrade policy's, in
`installer.config.upgrade`) can be declared in its own module without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from installer.config.values import Invalid

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class Setting:
    """One configurable value: its flag, its environment variable and how to parse it."""

    name: str
    flag: str
    envvar: str | None
    default: str | None
    help: str
    accepted: str
    parse: Callable[[str], Any]
    is_flag: bool = False
    multiple: bool = False


def choice(*choices: str) -> Callable[[str], str]:
    """A parser accepting one of `choices`, case-insensitively."""

    def parse(value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in choices:
            raise Invalid(value)
        return lowered

    return parse


def boolean(value: str) -> bool:
    """`true`/`false` and their usual spellings (1/0, yes/no, on/off; empty is false)."""
    lowered = value.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise Invalid(value)
