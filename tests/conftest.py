"""Shared fixtures: node host trees in real shapes, and a clean structlog per test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import structlog
from hypothesis import settings

from installer.testing import SAMPLE_NODES, build_node

# Properties, not timings: hypothesis' default 200 ms deadline per example is a timed
# assertion, and a loaded 2-core machine misses it (test_index_aliases_agree took 284 ms once).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


@pytest.fixture(autouse=True)
def _reset_structlog() -> None:
    """Each test starts with structlog's defaults, as a fresh process would."""
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _termination_log(tmp_path_factory: pytest.TempPathFactory,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    """No test (nor a CLI it starts) writes the host's real /dev/termination-log.

    The default is Kubernetes' path; on a test machine it is host data. Tests that check
    the termination log set TERMINATION_LOG (or --termination-log) themselves.
    """
    monkeypatch.setenv("TERMINATION_LOG",
                       str(tmp_path_factory.mktemp("termlog") / "termination-log"))


@pytest.fixture
def make_node(tmp_path: Path) -> Callable[[str], Path]:
    """Build a sample node's host tree (by name) under a fresh temp dir; returns its root."""

    def make(name: str) -> Path:
        root = tmp_path / name
        root.mkdir()
        return build_node(root, SAMPLE_NODES[name])

    return make

