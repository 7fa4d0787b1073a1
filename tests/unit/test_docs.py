"""README.md's settings and exit-code tables are generated from the code and must match it."""

from __future__ import annotations

from pathlib import Path

from installer.cli.docs import exit_code_table, settings_table
from installer.errors import InstallerError, error_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_tables_match_code() -> None:
    text = README.read_text()
    fix = "run: python scripts/render-readme-tables.py"
    assert settings_table() in text, fix
    assert exit_code_table() in text, fix


def test_exit_codes_are_unique_and_documented() -> None:
    codes = [cls.code for cls in error_table()]
    assert len(codes) == len(set(codes))
    assert all(cls.summary and cls.default_remedy and cls.slug for cls in error_table())


def test_one_line_contains_message_and_remedy() -> None:
    err = InstallerError("it broke", remedy="do this")
    err.stage = "fetch"
    assert err.one_line() == "error(internal): [fetch] it broke; fix: do this"
