"""The CDI spec's createContainer hook (installdir/cdihook) run as a runtime runs it: the
OCI state on stdin (runtime-spec config.md, "Hooks": `bundle`), the bundle's config.json
naming the container's root. The host's ldconfig writes the container's linker cache with
the driver's folder; whatever the image or the bundle holds, nothing is written outside the
container's root and the hook never fails the container (exit 0, one line on stderr)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from installer.installdir import cdihook

FOLDER = "/usr/local/nvidia/lib64"
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path("/sbin/ldconfig").exists(),
                                reason="ldconfig -r chroots: needs root and /sbin/ldconfig")


def _bundle(tmp_path: Path, config: object, *, root: str = "rootfs") -> tuple[Path, Path]:
    """A bundle with a container root holding one library in the driver's folder."""
    bundle = tmp_path / "bundle"
    rootfs = bundle / root
    (rootfs / "etc").mkdir(parents=True)
    lib = rootfs / FOLDER.lstrip("/")
    lib.mkdir(parents=True)
    libz = next(Path("/usr/lib/x86_64-linux-gnu").glob("libz.so.1.*"), None) or next(
        Path("/lib").rglob("libz.so.1.*"))
    shutil.copy(libz, lib / "libz.so.1")  # a library by its SONAME, as the staged links are
    (bundle / "config.json").write_text(config if isinstance(config, str)
                                        else json.dumps(config, indent=2))
    return bundle, rootfs


def _hook(tmp_path: Path, state: bytes) -> subprocess.CompletedProcess[bytes]:
    script = tmp_path / cdihook.HOOK_FILE
    cdihook.ensure(tmp_path)
    return subprocess.run([str(script), FOLDER], input=state, capture_output=True,
                          timeout=5, check=False)


def _state(bundle: Path) -> bytes:
    return json.dumps({"ociVersion": "1.0.2", "id": "c", "status": "creating", "pid": 1,
                       "bundle": str(bundle), "annotations": {}}).encode()


def test_the_folder_joins_the_containers_cache(tmp_path: Path) -> None:
    # an annotation that quotes a root elsewhere does not move it (JSON escapes its quotes)
    bundle, rootfs = _bundle(tmp_path, {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                        "annotations": {"x": '"root": {"path": "/etc"}'}})
    done = _hook(tmp_path, _state(bundle))
    assert done.returncode == 0, done.stderr
    cache = (rootfs / "etc/ld.so.cache").read_bytes()
    assert f"{FOLDER}/libz.so.1".encode() in cache
    assert not Path("/etc/ld.so.cache~").exists()


def test_an_image_whose_etc_points_outside_writes_only_inside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    bundle, rootfs = _bundle(tmp_path, {"root": {"path": "rootfs", "readonly": False}})
    shutil.rmtree(rootfs / "etc")
    (rootfs / "etc").symlink_to(outside)  # absolute: resolved inside the chroot
    (rootfs / outside.relative_to("/")).mkdir(parents=True)
    done = _hook(tmp_path, _state(bundle))
    assert done.returncode == 0, done.stderr
    assert list(outside.iterdir()) == []
    assert (rootfs / outside.relative_to("/") / "ld.so.cache").exists()


@pytest.mark.parametrize(("state", "config", "said"), [
    (b"", {"root": {"path": "rootfs"}}, "no bundle in the container state"),
    (b"\x00" * (1 << 20), {"root": {"path": "rootfs"}}, "no bundle in the container state"),
    (None, {"root": {"path": "/"}}, "container root / is not a directory"),
    (None, {"process": {}}, "no root.path in"),
    (None, {"root": {"path": "missing"}}, "is not a directory"),
    (None, "{not json", "no root.path in"),
])
def test_what_it_cannot_do_never_fails_the_container(
        tmp_path: Path, state: bytes | None, config: object, said: str) -> None:
    bundle, rootfs = _bundle(tmp_path, config)
    done = _hook(tmp_path, _state(bundle) if state is None else state)
    assert done.returncode == 0
    line = done.stderr.decode().strip()
    assert line.startswith("gpu-node-installer cdi hook: ") and said in line, line
    assert line.endswith("linker cache not updated") and "\n" not in line
    assert not (rootfs / "etc/ld.so.cache").exists()
