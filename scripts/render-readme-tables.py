#!/usr/bin/env python3
"""Rewrite README.md's settings and exit-code tables from the code (the one source of truth).

`tests/unit/test_docs.py` fails when README.md and the code disagree; run this to fix it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from installer.cli.docs import exit_code_table, settings_table

README = Path(__file__).resolve().parent.parent / "README.md"


def replace_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


def main() -> None:
    text = README.read_text(encoding="utf-8")
    text = replace_block(text, "settings-table", settings_table())
    text = replace_block(text, "exit-codes", exit_code_table())
    README.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
