"""fetch with real parts: NVIDIA's 535.261.03 libraries over HTTP with drops, and TLS mirrors."""

from __future__ import annotations

import filecmp
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from installer.cli import logs
from installer.config import load_config
from installer.context import Context
from installer.node.host import RealHost, Roots
from installer.stages.fetch import run as fetch_run
from tests.artifacts import LIB_DIR, nvidia_tree
from tests.host.test_fetch import invoke, named
from tests.httpserver import Fault, MirrorServer, self_signed
from tests.packages import KERNEL, write_index, write_package

VERSION = "535.261.03"
LIBS = ("libcuda.so.535.261.03", "libnvidia-ml.so.535.261.03",
        "libnvidia-ptxjitcompiler.so.535.261.03", "libnvidia-nvvm.so.535.261.03")


@pytest.fixture(scope="module")
def real_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository whose package holds NVIDIA's real user-mode libraries (about 137 MB)."""
    libs = nvidia_tree(VERSION) / LIB_DIR
    repo = tmp_path_factory.mktemp("real") / "repo"
    write_package(repo, version=VERSION, files={},
                  big={f"lib64/{name}": libs / name for name in LIBS})
    write_index(repo, {"default": "535"})
    return repo


def context(host: Path, **flags: object) -> Context:
    config = load_config({"host_root": str(host), "proc_root": str(host / "proc"),
                          "sys_root": str(host / "sys"), **flags}, {})
    logs.configure("json", "info")
    return Context(config, RealHost(Roots.from_config(config)), logs.get_logger())


def test_real_libraries_survive_drops(make_node: Callable[[str], Path], real_repo: Path
                                      ) -> None:
    host = make_node("debian12-l4")
    cuda = f"/{KERNEL}/{VERSION}/proprietary/lib64/{LIBS[0]}"
    with MirrorServer(real_repo) as server:
        server.fault(cuda, Fault("drop", after=7_000_000, times=2))
        server.fault(f"/{KERNEL}/{VERSION}/proprietary/lib64/{LIBS[1]}",
                     Fault("status", status=503))
        package = fetch_run(context(host, mirrors=(server.url,), allow_http=True))
        assert [r.status for r in server.requests_for(cuda)] == [200, 206, 206]
    libs = nvidia_tree(VERSION) / LIB_DIR
    for name in LIBS:
        local = package.path_of(f"lib64/{name}")
        assert filecmp.cmp(local, libs / name, shallow=False), name
        assert local.stat().st_mode & 0o222 == 0  # blobs are read-only
    assert package.manifest.total_size > 130_000_000


def test_https_mirror_needs_its_ca(make_node: Callable[[str], Path], tmp_path: Path) -> None:
    host = make_node("gke-cos-a100x8")
    repo = tmp_path / "repo"
    write_package(repo, kernel="6.1.58+")
    write_index(repo)
    cert, key = self_signed(tmp_path)
    with MirrorServer(repo, tls=(cert, key)) as server:
        # a COS node: only the mirror is under test here (no Google bucket to reach)
        refused = invoke(host, "fetch", "--mirror", server.url, "--download-retries", "1",
                         "--driver-version", VERSION, "--cos-source", "never")
        accepted = invoke(host, "fetch", "--mirror", server.url, "--ca-bundle", str(cert),
                          "--output", "json", "--cos-source", "never")
    assert refused.exit_code == 6, refused.stderr
    assert "TLS verification failed" in refused.stderr and "--ca-bundle" in refused.stderr
    assert accepted.exit_code == 0, accepted.stderr
    assert json.loads(accepted.stdout)["source"] == f"mirror {server.url}"
    assert not named(accepted, "source unavailable")
