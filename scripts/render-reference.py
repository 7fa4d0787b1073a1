#!/usr/bin/env python3
"""Rewrite docs/reference.md's generated tables from the code (the one source of truth):
commands and their options (the click group), settings (installer.config), exit codes
(installer.errors).

`tests/unit/test_docs.py` fails when docs/reference.md and the code disagree; run this to fix it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from installer.cli.docs import BLOCKS

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"


def replace_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{REFERENCE}: no <!-- {name}:begin --> ... <!-- {name}:end --> block")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


def main() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    for name, render in BLOCKS.items():
        text = replace_block(text, name, render())
    REFERENCE.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
