"""Fixtures the host-tier files share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubefake
import pytest
from agentnode import daemon_package
from fallbacknode import headers_debs, unpack_headers
from healthkit import fifo_log
from kubefake import Cluster, node_doc
from native import build_standins, packages
from native.nvmlsession import clear_fake_env
from native.packages import tree_package

from installer.node.host import RealHost
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


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled NVML and CUDA stand-ins (tests/native), once a module."""
    return build_standins(tmp_path_factory.mktemp("nvml"))


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No FAKE_* variable of this environment steers a stand-in: every test sets its own,
    on the monkeypatch returned."""
    for name in clear_fake_env():
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def xid_file(fake_env: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty file the NVML stand-in delivers Xid events from (FAKE_NVML_XID_FILE): each
    line "<gpu index> <xid>" appended to it, once."""
    path = tmp_path / "xids"
    path.touch()
    fake_env.setenv("FAKE_NVML_XID_FILE", str(path))
    return path


@pytest.fixture
def fifo_host(tmp_path: Path) -> Iterator[tuple[RealHost, int]]:
    """A host tree whose kernel log (<dev root>/kmsg) is a FIFO, and the writer's descriptor
    (healthkit.fifo_log), for the health watcher's cases."""
    with fifo_log(tmp_path) as found:
        yield found


@pytest.fixture(scope="module")
def headers_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Debian's three real headers .debs of the fallback kernel unpacked as dpkg would (once
    per module; hard-linked after)."""
    debs = headers_debs()
    if debs is None:
        pytest.skip("needs dpkg-deb and gcc-12 (the kernel's compiler) on this machine: "
                    "make deps")
    return unpack_headers(debs, tmp_path_factory.mktemp("headers") / "root")
