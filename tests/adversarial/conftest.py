"""Fixtures of the adversarial suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agentnode import AgentNode, daemon_package
from httpserver import MirrorServer

from adversarial.agentkit import agent_node, kill_standins
from adversarial.harness import Arena, make_arena
from adversarial.mirrorkit import copy_repo
from installer.packages.manifest import Package


@pytest.fixture
def arena(tmp_path: Path) -> Arena:
    """A node with a driver repository beside it and sentinel data outside the host root."""
    return make_arena(tmp_path / "arena")


@pytest.fixture
def http_bad(arena: Arena) -> Iterator[tuple[MirrorServer, Path]]:
    """A spoilable copy of the repository served over plain http (the mirror cases)."""
    repo = copy_repo(arena, "bad")
    with MirrorServer(repo) as server:
        yield server, repo


@pytest.fixture(scope="module")
def agent_package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    """A driver package carrying the daemons' stand-ins, once a module."""
    return daemon_package(tmp_path_factory.mktemp("pkg"))


@pytest.fixture
def node(tmp_path: Path, agent_package: Package) -> Iterator[AgentNode]:
    """An 8-GPU NVSwitch node made ready by the real signal, for the agent's groups (a
    module of another node defines its own `node`); its stand-ins killed after."""
    node = agent_node(tmp_path, agent_package)
    yield node
    kill_standins(node)
