"""Fixtures the unit-tier files share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, str]:
    """The host, proc and sys roots of an empty temp host tree, as load_config's flags."""
    for name in ("proc", "sys"):
        (tmp_path / name).mkdir()
    return {"host_root": str(tmp_path), "proc_root": str(tmp_path / "proc"),
            "sys_root": str(tmp_path / "sys")}
