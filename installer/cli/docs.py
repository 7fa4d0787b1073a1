"""Markdown tables generated from the code, so README.md cannot drift from it."""

from __future__ import annotations

from installer.config import SETTINGS
from installer.errors import error_table


def settings_table() -> str:
    """Flag, environment variable, default and accepted values of every setting."""
    rows = ["| flag | env | default | accepted | what |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        default = f"`{s.default}`" if s.default else "derived"
        rows.append(f"| `{s.flag}` | `{s.envvar or ''}` | {default} | {s.accepted} | {s.help} |")
    return "\n".join(rows) + "\n"


def exit_code_table() -> str:
    """Exit code, slug and meaning of every failure class."""
    rows = ["| code | slug | meaning | usual fix |", "|---|---|---|---|", "| 0 | | success | |"]
    for cls in error_table():
        rows.append(f"| {cls.code} | `{cls.slug}` | {cls.summary} | {cls.default_remedy} |")
    return "\n".join(rows) + "\n"
