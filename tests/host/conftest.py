"""Fixtures the host-tier files share."""

from __future__ import annotations

from collections.abc import Iterator

import kubefake
import pytest
from agentnode import daemon_package
from kubefake import Cluster, node_doc
from native import build_standins, packages
from native.packages import tree_package

from installer.packages.manifest import Package

STANDIN_VERSION = "535.261.03"


@pytest.fixture(scope="session")
def standin_package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    """The stand-in driver (NVML/CUDA C stand-ins) as a package, built once per session."""
    built = build_standins(tmp_path_factory.mktemp("standins"))
    tree = packages.standin_tree(tmp_path_factory.mktemp("s") / "tree", built,
                                 STANDIN_VERSION)
    return tree_package(tree, STANDIN_VERSION)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Package:
    """A driver package carrying the daemons' stand-ins (the agent's files), once a module."""
    return daemon_package(tmp_path_factory.mktemp("pkg"))


@pytest.fixture
def cluster() -> Iterator[tuple[str, Cluster]]:
    """The strict fake API server with the agent's node; no request may have failed."""
    cluster = Cluster(nodes={"gpu-node-1": node_doc("gpu-node-1")})
    with kubefake.serve(cluster) as url:
        yield url, cluster
    assert not cluster.errors, cluster.errors
