"""A node without a package for its kernel, for BUILD_FALLBACK: real headers under the host root.

The node (a host tree, kernel simulated by FakeKernelHost) runs the kernel tier's Debian
kernel (bookworm's current one); its real headers .debs (downloaded into the kernel tier's
cache when missing) are unpacked under the host root
as dpkg lays them out, with the absolute `/lib/modules/<release>/build` link a real node has,
and the node's own drm, drm_kms_helper and video modules that NVIDIA's modules depend on.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

from kernel import assets

from installer.testing import SAMPLE_NODES, build_node
from installer.testing.kernel import write_host_module

RELEASE = assets.kernel_release()
_HOST_MODULES = (("kernel/drivers/gpu/drm/drm.ko", "drm", ()),
                 ("kernel/drivers/gpu/drm/drm_kms_helper.ko", "drm_kms_helper", ("drm",)),
                 ("kernel/drivers/acpi/video.ko", "video", ()))


def headers_debs() -> list[Path] | None:
    """The headers .debs (with -common and linux-kbuild; fetched once, cached), or None when
    this machine cannot unpack or compile them (no dpkg-deb or gcc-12: `make deps`)."""
    if shutil.which("dpkg-deb") is None or shutil.which("gcc-12") is None:
        return None
    return assets.release_headers_debs(RELEASE)


def unpack_headers(debs: list[Path], root: Path) -> Path:
    """The .debs unpacked into `root` as dpkg would lay them out."""
    root.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return root


def make_node(root: Path, headers: Path | None, **security: object) -> Path:
    """A GPU node on RELEASE; with `headers` (hard-linked in), its build tree and modules."""
    root.mkdir()
    build_node(root, dataclasses.replace(SAMPLE_NODES["gke-ubuntu-t4"], kernel=RELEASE,
                                         **security))  # type: ignore[arg-type]
    if headers is not None:
        subprocess.run(["cp", "-al", f"{headers}/.", str(root)], check=True)
        tree = root / "lib/modules" / RELEASE
        build = tree / "build"
        build.parent.mkdir(parents=True, exist_ok=True)
        build.unlink(missing_ok=True)
        build.symlink_to(f"/usr/src/linux-headers-{RELEASE}")  # absolute, as on a node
        for relpath, name, depends in _HOST_MODULES:
            write_host_module(tree, relpath, name, depends)
        (tree / "modules.dep").write_text("".join(
            f"{relpath}:{''.join(' ' + p for p, n, _ in _HOST_MODULES if n in depends)}\n"
            for relpath, _, depends in _HOST_MODULES))
    return root

