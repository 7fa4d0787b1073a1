"""Shared fixtures: node host trees in real shapes, and a clean structlog per test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from installer.testing import SAMPLE_NODES, build_node


@pytest.fixture(autouse=True)
def _reset_structlog() -> None:
    """Each test starts with structlog's defaults, as a fresh process would."""
    structlog.reset_defaults()


@pytest.fixture
def make_node(tmp_path: Path) -> Callable[[str], Path]:
    """Build a sample node's host tree (by name) under a fresh temp dir; returns its root."""

    def make(name: str) -> Path:
        root = tmp_path / name
        root.mkdir()
        return build_node(root, SAMPLE_NODES[name])

    return make

