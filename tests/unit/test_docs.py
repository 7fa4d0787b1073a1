"""docs/reference.md's tables (commands, options, settings, exit codes) are generated from the
code and must match it."""

from __future__ import annotations

from pathlib import Path

from installer.cli.docs import BLOCKS
from installer.errors import InstallerError, error_table

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def test_reference_tables_match_code() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    fix = "run: python scripts/render-reference.py"
    for name, render in BLOCKS.items():
        block = f"<!-- {name}:begin -->\n{render()}<!-- {name}:end -->"
        assert block in text, f"{name}: {fix}"


def test_exit_codes_are_unique_and_documented() -> None:
    codes = [cls.code for cls in error_table()]
    assert len(codes) == len(set(codes))
    assert all(cls.summary and cls.default_remedy and cls.slug for cls in error_table())


def test_one_line_contains_message_and_remedy() -> None:
    err = InstallerError("it broke", remedy="do this")
    err.stage = "fetch"
    assert err.one_line() == "error(internal): [fetch] it broke; fix: do this"
