"""`install` with BUILD_FALLBACK: no package for the kernel, a source package in the repository.

The node is a host tree whose kernel (FakeKernelHost) runs Debian's 6.1.0-57-amd64, with that
kernel's real headers unpacked under the host root as dpkg lays them out and the absolute
`/lib/modules/<release>/build` link a real node has. The source package holds the NVML/CUDA
stand-ins and an NVIDIA-shaped module tree (the stand-in modules), which the fallback really
compiles with make and gcc-12 against those headers (seconds, not the real 535's minutes).
Refusals are one line with their exit code, and leave the install dir empty.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from e2e import events, run_cli, standin_env
from fallbacknode import RELEASE, make_node
from helpers import node_args
from native import build_standins
from native.packages import standin_tree
from nvsources import fake_headers, mini_source

from installer.packages.builder import BuildRequest, build
from installer.packages.manifest import SOURCE_RELEASE, parse_manifest
from installer.packages.repository import parse_index

VERSION = "535.261.03"
FLAVOUR = "open"  # the stand-in modules are GPL, like the open flavour
INSTALL_DIR = "home/kubernetes/bin/nvidia"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository holding only a source package (stand-in user mode, stand-in sources)."""
    work = tmp_path_factory.mktemp("source")
    tree = standin_tree(work / "tree", build_standins(work / "built"), VERSION)
    result = build(BuildRequest(trees=(tree,), nvidia_source=mini_source(work / "nv"),
                                repo=work / "repo", aliases=("default",)))
    assert result.manifest.kernel_release == SOURCE_RELEASE
    return work / "repo"


def _node(base: Path, headers: Path | None, **security: object) -> Path:
    return make_node(base / "node", headers, **security)


def _install(root: Path, repo: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["install", *node_args(root), "--log-format", "json", "--output", "json",
                    "--mirror", f"file://{repo}", "--driver-version", VERSION, *extra],
                   standin_env(VERSION), timeout=300)


def _refused(done: subprocess.CompletedProcess[str], code: int, root: Path) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("error(")]
    assert done.returncode == code, done.stderr[-2000:]
    assert len(lines) == 1, done.stderr[-2000:]
    install = root / INSTALL_DIR
    assert not (install / ".ready.json").exists() and not (install / ".current").exists()
    assert not (install / "lib64").exists()
    return lines[0]


class TestSourcePackage:
    """`package build --nvidia-source` without headers: a source package, marked as such."""

    def test_manifest_and_index_mark_it(self, repo: Path) -> None:
        path = repo / SOURCE_RELEASE / VERSION / FLAVOUR
        manifest = parse_manifest((path / "manifest.json").read_bytes())
        kinds = {f.kind for f in manifest.files}
        assert manifest.kernel_release == SOURCE_RELEASE and not manifest.modules
        assert {"library", "source"} <= kinds
        assert any(f.path == "kernel-source/Kbuild" for f in manifest.files)
        raw = json.loads((repo / "index.json").read_text())
        entry = raw["packages"][0]
        # only the fields every reader knows: an older installer parses it, never matches it
        assert set(entry) <= {"driver_version", "kernel_release", "arch", "flavour", "path",
                              "manifest_sha256", "os"}
        assert entry["kernel_release"] == SOURCE_RELEASE
        assert entry["path"] == f"source/{VERSION}/{FLAVOUR}"
        assert parse_index((repo / "index.json").read_bytes()).packages[0].kernel_release \
            == SOURCE_RELEASE


class TestRefusals:
    def test_never_names_the_fallback(self, tmp_path: Path, repo: Path) -> None:
        root = _node(tmp_path, None)
        line = _refused(_install(root, repo), 5, root)
        assert f"for kernel {RELEASE}" in line and "BUILD_FALLBACK=auto" in line

    def test_no_build_tree_names_the_headers_package(self, tmp_path: Path, repo: Path
                                                     ) -> None:
        root = _node(tmp_path, None)
        line = _refused(_install(root, repo, "--build-fallback", "auto"), 5, root)
        assert f"no kernel build tree for {RELEASE}" in line
        assert f"apt-get install linux-headers-{RELEASE}" in line

    def test_sig_enforce_without_key(self, tmp_path: Path, repo: Path) -> None:
        root = _node(tmp_path, None, sig_enforce=True)
        line = _refused(_install(root, repo, "--build-fallback", "auto"), 8, root)
        assert "only loads signed modules" in line and "BUILD_SIGN_KEY" in line

    def test_no_compiler_names_the_build_image(self, tmp_path: Path, repo: Path) -> None:
        root = _node(tmp_path, None)
        fake_headers(root / "usr/src" / f"linux-headers-{RELEASE}", RELEASE)
        (root / "lib/modules" / RELEASE).mkdir(parents=True, exist_ok=True)
        (root / "lib/modules" / RELEASE / "build").symlink_to(
            f"/usr/src/linux-headers-{RELEASE}")
        env = {**standin_env(VERSION), "PATH": str(tmp_path / "empty")}
        done = run_cli(["install", *node_args(root), "--log-format", "json", "--mirror",
                        f"file://{repo}", "--driver-version", VERSION, "--build-fallback",
                        "auto"], env)
        line = _refused(done, 5, root)
        assert "gcc-12 not found" in line and "target `build`" in line

    def test_corrupt_source_package(self, tmp_path: Path, repo: Path,
                                    headers_root: Path) -> None:
        broken = tmp_path / "repo"
        shutil.copytree(repo, broken)
        kbuild = broken / SOURCE_RELEASE / VERSION / FLAVOUR / "kernel-source/Kbuild"
        kbuild.write_text(kbuild.read_text() + "# tampered\n")
        root = _node(tmp_path, headers_root)
        line = _refused(_install(root, broken, "--build-fallback", "auto"), 7, root)
        assert "Kbuild" in line

    def test_no_source_package(self, tmp_path: Path, headers_root: Path) -> None:
        empty = tmp_path / "repo"
        empty.mkdir()
        (empty / "index.json").write_text('{"schema_version": 1, "packages": []}')
        root = _node(tmp_path, headers_root)
        line = _refused(_install(root, empty, "--build-fallback", "auto"), 5, root)
        assert "no source package for driver" in line


def test_builds_on_the_node_then_fast_path(tmp_path: Path, repo: Path, headers_root: Path
                                           ) -> None:
    """Built with make against the node's real headers, cached by digest, then fast path."""
    root = _node(tmp_path, headers_root)
    first = _install(root, repo, "--build-fallback", "auto")
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads(first.stdout)["fast_path"] is False
    built = [e for e in events(first.stderr) if e["event"] == "package built on node"]
    assert len(built) == 1 and float(str(built[0]["duration_s"])) > 0
    install = root / INSTALL_DIR
    assert json.loads((install / ".ready.json").read_text())["driver_version"] == VERSION
    state = json.loads((install / ".state.json").read_text())
    assert state["kernel_release"] == RELEASE
    ref = json.loads((install / ".cache/refs" / f"{state['package_digest']}.json").read_text())
    assert ref["kernel_release"] == RELEASE and ref["digest"] == state["package_digest"]
    modules = sorted(p.name for p in (install / "drivers").iterdir())
    assert "nvidia.ko" in modules
    assert not list((install / ".cache/tmp").glob("run-*/*build*"))  # work area removed
    second = _install(root, repo, "--build-fallback", "auto")
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads(second.stdout)["fast_path"] is True
    assert not [e for e in events(second.stderr) if e["event"] == "package built on node"]
    assert os.readlink(install / ".current").endswith(f"{VERSION}-{RELEASE}-{FLAVOUR}")


class TestBuildTree:
    """The node's build tree, copied into our work area with every name re-rooted."""

    def test_links_and_common_include_point_under_the_host_root(
            self, tmp_path: Path, headers_root: Path) -> None:
        from installer.node.host import Roots
        from installer.stages.fetch.buildtree import copy_build_tree, find_build_tree

        root = _node(tmp_path, headers_root)
        roots = Roots(root, root / "proc", root / "sys", root / "dev")
        tree = find_build_tree(roots, RELEASE)
        assert tree == root / "usr/src" / f"linux-headers-{RELEASE}"  # absolute link, confined
        copy = copy_build_tree(roots, tree, tmp_path / "copy")
        scripts = copy / "scripts"
        assert scripts.is_symlink() and os.readlink(scripts).startswith(f"{root}/")
        assert (scripts / "Makefile.build").is_file()
        common = RELEASE.rsplit("-", 1)[0] + "-common"
        assert f"include {root}/usr/src/linux-headers-{common}/Makefile" in (
            copy / "Makefile").read_text()
        # the node's own tree is untouched (its Makefile still names the node's path)
        assert f"include /usr/src/linux-headers-{common}/Makefile" in (tree / "Makefile"
                                                                        ).read_text()


def test_sign_key_and_cert_go_together(tmp_path: Path) -> None:
    from installer.config import load_config
    from installer.errors import ConfigError

    flags = {"host_root": str(tmp_path), "proc_root": str(tmp_path), "sys_root": str(tmp_path)}
    with pytest.raises(ConfigError, match="--build-sign-key and --build-sign-cert go together"):
        load_config(flags, {"BUILD_SIGN_KEY": "/keys/key.pem"})
    with pytest.raises(ConfigError, match="BUILD_FALLBACK='sometimes' is invalid"):
        load_config(flags, {"BUILD_FALLBACK": "sometimes"})
    assert load_config(flags, {}).build_fallback == "never"


def test_sig_enforce_node_gets_modules_signed_with_the_configured_key(
        tmp_path: Path, repo: Path, headers_root: Path) -> None:
    """With BUILD_SIGN_KEY/CERT the built modules carry a signature the enforcing kernel takes;
    a key that cannot sign is refused before anything is fetched or compiled."""
    from signing_keys import make_key

    keys = make_key(tmp_path / "keys")
    root = _node(tmp_path, headers_root, sig_enforce=True)
    bad = _install(root, repo, "--build-fallback", "auto", "--build-sign-key",
                   str(keys.cert), "--build-sign-cert", str(keys.cert))
    assert "BUILD_SIGN_KEY/BUILD_SIGN_CERT" in _refused(bad, 2, root)
    done = _install(root, repo, "--build-fallback", "auto", "--build-sign-key", str(keys.key),
                    "--build-sign-cert", str(keys.cert))
    assert done.returncode == 0, done.stderr[-3000:]
    nvidia = root / INSTALL_DIR / "drivers" / "nvidia.ko"
    assert nvidia.read_bytes().endswith(b"~Module signature appended~\n")
