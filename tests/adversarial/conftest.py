"""Fixtures of the adversarial suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from adversarial.harness import Arena, make_arena


@pytest.fixture
def arena(tmp_path: Path) -> Arena:
    """A node with a driver repository beside it and sentinel data outside the host root."""
    return make_arena(tmp_path / "arena")
