"""The next kernel, prepared before it boots, on two of Debian's real kernels.

Boot 1 runs bookworm's 6.1.0-56-amd64: a normal install (its package from the mirror), ready;
6.1.0-57-amd64's modules tree and real headers are installed beside it. Then the node agent
runs (the DaemonSet's settings in its env, no API: its view says the next kernel): it finds
57 under /lib/modules and prepares it, `nice -n 19 ionice -c 3 gpu-node-installer prepare
--kernel 6.1.0-57-amd64 -o json`. The mirror has no package for 57, only a source package,
so with BUILD_FALLBACK=auto the preparation compiles the stand-in modules from 57's real
headers into the host cache, and loads nothing; the agent says `ready`, and is stopped.

Boot 2 reboots the same node (its /home/kubernetes carried over, tests/kernel/nextkernel.py)
into 6.1.0-57-amd64: `install` takes the fast path from the cache, compiles nothing (57's
headers are there: it could), downloads nothing (the mirror's access log stays empty), and
the modules load with a real finit_module on the kernel they were built for.

The GPU is simulated as in test_fallback_kernel.py. Runs under KVM where KVM boots the
kernel, else TCG (slower; `GNI_FALLBACK_TCG=1` forces it); never skips for want of KVM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from . import nextkernel
from .assets import Kernel
from .nextkernel import Boot

MODULES = {"nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"}
pytestmark = pytest.mark.timeout(3000)


@pytest.fixture(scope="module")
def boots(kernel: Kernel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Boot, Boot]:
    """Boot 1 on OLD (install, then prepare NEW), boot 2 on NEW from boot 1's disk."""
    work = tmp_path_factory.mktemp("next-kernel")
    old = nextkernel.old_kernel()
    kvm = nextkernel.use_kvm(kernel)
    repo = nextkernel.make_repo(work / "mirror")
    first = nextkernel.boot(old, kernel, repo, work / "boot1", disk=None, kvm=kvm,
                            by_agent=True)
    assert first.result.rc == 0, first.result.describe()
    second = nextkernel.boot(kernel, kernel, repo, work / "boot2", disk=first.out / "disk.tar",
                             kvm=kvm)
    assert second.result.rc == 0, second.result.describe()
    return first, second


def _log(boot: Boot, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in boot.text(name).splitlines() if line.startswith("{")]


def _installed(boot: Boot) -> dict[str, Any]:
    assert boot.text("install.rc").strip() == "0", boot.text("install.log")[-4000:]
    result: dict[str, Any] = json.loads(boot.text("install.json"))
    return result


def test_old_kernel_installed_from_the_mirror(boots: tuple[Boot, Boot]) -> None:
    first, _ = boots
    assert first.text("release").strip() == nextkernel.OLD_RELEASE
    _installed(first)
    log = _log(first, "install.log")
    assert [e["source"].split()[0] for e in log
            if e.get("event") == "stage finished" and e.get("stage") == "fetch"] == ["mirror"]
    assert set(first.text("modules").split()) >= MODULES
    assert any(f"/{nextkernel.OLD_RELEASE}/" in line for line in first.downloads())


def _prepared(boot: Boot, kernel: Kernel) -> dict[str, Any]:
    """The host cache's ref of NEW's package after boot 1."""
    refs = [json.loads(path.read_text()) for path in (boot.out / "refs").glob("*.json")]
    found: list[dict[str, Any]] = [r for r in refs if r["kernel_release"] == kernel.release]
    assert len(found) == 1, refs
    return found[0]


def test_the_agent_prepares_new_from_its_headers_into_the_cache(boots: tuple[Boot, Boot],
                                                                kernel: Kernel) -> None:
    first, _ = boots
    assert first.text("build-link").strip() == f"/usr/src/linux-headers-{kernel.release}"
    said = json.loads(first.text("agent-view.json")).get("next_kernel")
    assert said is not None, first.text("agent.log")[-4000:]
    assert (said["kernel"], said["state"], said["driver"]) == (
        kernel.release, "ready", nextkernel.VERSION), first.text("prepare.log")[-4000:]
    assert "(from built, " in said["message"]
    assert first.text("agent.rc").strip() == "0", first.text("agent.log")[-4000:]
    agent = _log(first, "agent.log")
    [started] = [e for e in agent if e.get("event") == "next kernel preparation started"]
    assert started["kernel"] == kernel.release
    assert started["argv"][:6] == ["nice", "-n", "19", "ionice", "-c", "3"]
    assert started["argv"][-5:] == ["prepare", "--kernel", kernel.release, "-o", "json"]
    built = [e for e in _log(first, "prepare.log") if e.get("event") == "package built on node"]
    assert [e["kernel"] for e in built] == [kernel.release]
    ref = _prepared(first, kernel)
    assert ref["driver_version"] == nextkernel.VERSION
    assert said["message"].endswith(f"{ref['digest'][:19]})")


def test_prepare_loads_and_stages_nothing(boots: tuple[Boot, Boot], kernel: Kernel) -> None:
    first, _ = boots
    assert first.text("modules-after") == first.text("modules")  # /proc/modules unchanged
    assert first.text("dir-after") == first.text("dir-before")  # the install dir untouched
    assert first.text("dir-before").strip()
    assert not [v for v in first.text("versions").split() if kernel.release in v]


def test_reboot_into_new_takes_the_cache_path(boots: tuple[Boot, Boot], kernel: Kernel) -> None:
    """The prepared package, from the host cache: no compile, no download, loaded on NEW.
    (The install's own `fast_path` means "already staged", which a new kernel never is.)"""
    first, second = boots
    assert second.text("release").strip() == kernel.release
    result = _installed(second)
    assert result["package_digest"] == _prepared(first, kernel)["digest"]
    log = _log(second, "install.log")
    assert [e["source"] for e in log
            if e.get("event") == "stage finished" and e.get("stage") == "fetch"] == [
        f"cache {nextkernel.INSTALL_DIR}/.cache"]
    assert "package built on node" not in {e.get("event") for e in log}  # no compile...
    assert second.text("build-link").strip() == f"/usr/src/linux-headers-{kernel.release}"
    assert second.downloads() == []  # ...and no download: the mirror served nothing
    assert set(second.text("modules").split()) >= MODULES  # a real finit_module on NEW
    assert [v for v in second.text("versions").split() if kernel.release in v]


def test_disk_carried_over(boots: tuple[Boot, Boot]) -> None:
    """Boot 2 started from boot 1's install dir (the harness's reboot is real)."""
    first, second = boots
    assert (Path(first.out) / "disk.tar").stat().st_size > 0
    assert [v for v in second.text("versions").split() if nextkernel.OLD_RELEASE in v]
