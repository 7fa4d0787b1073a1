"""Fixtures the host-tier files share."""

from __future__ import annotations

import pytest
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
