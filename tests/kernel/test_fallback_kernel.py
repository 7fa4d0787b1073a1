"""BUILD_FALLBACK=auto on a real kernel: no package for the guest's kernel, a source package in
a local repository; `install` builds the modules inside the guest, loads them, reaches ready,
and the next run takes the fast path.

As in `make demo`, the GPU is simulated (a T4's PCI sysfs entry bind-mounted in the guest, the
stand-in `nvidia` modules that act for one GPU, stand-in NVML/CUDA): NVIDIA's real 535 modules
would compile the same way but refuse to load without a GPU (ENODEV), and take minutes to
compile. The guest unpacks Debian's real headers .debs into its own root (a tmpfs overlay:
nothing reaches the host) exactly as dpkg would, `/lib/modules/<release>/build` link included,
and compiles with the host's gcc-12 and make. It runs under KVM where KVM can boot the kernel,
else under TCG (slower: about 4 minutes on 2 cores; `GNI_FALLBACK_TCG=1` forces TCG). It never
skips for want of KVM.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from native import build_standins
from native.packages import standin_tree
from nvsources import mini_source

from installer.packages.builder import BuildRequest, build

from . import assets, guest
from .assets import Kernel
from .conftest import GuestRunner

VERSION = "535.261.03"

SCRIPT = r"""
set -e
{fake_gpu}
# as dpkg lays them out: a merged-/usr root keeps its /lib -> usr/lib link (dpkg-deb -x would
# replace it with a directory, and the dynamic loader with it)
for deb in {debs}; do dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C /; done
readlink /lib/modules/$(uname -r)/build > "$GNI_OUT/build-link"
args="--host-root / --proc-root /proc --sys-root /sys --dev-root /dev --log-format json
      --mirror file://{repo} --driver-version {version} --build-fallback auto
      --termination-log /tmp/termination-log --output json"
set +e
{python} -m installer install $args > "$GNI_OUT/first.json" 2> "$GNI_OUT/first.log"
echo $? > "$GNI_OUT/first.rc"
{python} -m installer install $args > "$GNI_OUT/second.json" 2> "$GNI_OUT/second.log"
echo $? > "$GNI_OUT/second.rc"
cut -d' ' -f1 /proc/modules > "$GNI_OUT/modules"
ls /home/kubernetes/bin/nvidia/.cache/refs > "$GNI_OUT/refs"
"""


def _source_repo(work: Path) -> Path:
    """A repository holding only a source package: stand-in user mode, stand-in sources."""
    sources = mini_source(work / "nvidia-src", VERSION)
    with (sources / "Kbuild").open("a") as kbuild:  # reads like the open flavour, as it is
        kbuild.write("ccflags-y += -DGNI_OPEN_FLAVOUR\n")
    tree = standin_tree(work / "user", build_standins(work / "built"), VERSION)
    build(BuildRequest(trees=(tree,), nvidia_source=sources, repo=work / "repo"))
    return work / "repo"


@pytest.mark.timeout(1500)
def test_install_builds_on_the_node_then_fast_path(kernel: Kernel, tmp_path: Path,
                                                    run_guest: GuestRunner) -> None:
    tcg = (os.environ.get("GNI_FALLBACK_TCG") == "1"
           or guest.kvm_unavailable_reason(kernel) is not None)
    repo = _source_repo(tmp_path)
    debs = " ".join(str(d) for d in assets.headers_debs(kernel))
    result = run_guest(SCRIPT.format(fake_gpu=guest.FAKE_GPU_SH, debs=debs, repo=repo,
                                     version=VERSION,
                                     python=sys.executable),
                       kvm=not tcg, cpus=2, memory_mb=4096, timeout=1400 if tcg else 600)
    assert result.rc == 0, result.describe()
    out = result.files
    assert (out / "build-link").read_text().strip() == f"/usr/src/linux-headers-{kernel.release}"
    first_log = (out / "first.log").read_text()
    assert (out / "first.rc").read_text().strip() == "0", first_log[-4000:]
    first = json.loads((out / "first.json").read_text())
    assert first["fast_path"] is False
    built = [json.loads(line) for line in first_log.splitlines()
             if line.startswith("{") and '"package built on node"' in line]
    assert len(built) == 1 and built[0]["kernel"] == kernel.release, first_log[-4000:]
    second_log = (out / "second.log").read_text()
    assert (out / "second.rc").read_text().strip() == "0", second_log[-4000:]
    assert json.loads((out / "second.json").read_text())["fast_path"] is True
    assert "package built on node" not in second_log
    modules = (out / "modules").read_text().split()
    assert {"nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"} <= set(modules)
    refs = (out / "refs").read_text().split()
    assert len([r for r in refs if r.endswith(".json")]) == 2  # the source and the built one
