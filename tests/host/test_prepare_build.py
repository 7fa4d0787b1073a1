"""`prepare --kernel RELEASE` with BUILD_FALLBACK=auto: built on the node from that kernel's
headers, cached, and taken by the boot's `install` without compiling or downloading.

The node (fallbacknode: a host tree with Debian's real headers of RELEASE unpacked as dpkg
lays them out) runs an older kernel, OLD (the simulated kernel's release); RELEASE is
installed beside it. The repository holds only a source package (the stand-in sources,
compiled with make and gcc-12 against the real headers, as tests/host/test_fallback.py
does for the running kernel).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from e2e import events, run_cli, standin_env
from fallbacknode import RELEASE, make_node
from helpers import node_args
from host.test_fallback import repo

VERSION = "535.261.03"
FLAVOUR = "open"  # the stand-in modules are GPL, like the open flavour
INSTALL_DIR = "home/kubernetes/bin/nvidia"
OLD = "6.1.0-9-cloud-amd64"
__all__ = ["repo"]  # the fixture, as tests/host/test_fallback.py makes it (headers_root: conftest)


def _boot(root: Path, release: str) -> None:
    """The simulated kernel now runs `release` (what a reboot into it does)."""
    (root / "proc/sys/kernel/osrelease").write_text(release + "\n")


def _run(command: str, root: Path, mirror: str, *extra: str
         ) -> subprocess.CompletedProcess[str]:
    return run_cli([command, *node_args(root), "--log-format", "json", "--output", "json",
                    "--mirror", mirror, "--driver-version", VERSION, "--build-fallback",
                    "auto", *extra], standin_env(VERSION), timeout=300)


def test_built_for_the_next_kernel_then_taken_at_boot(tmp_path: Path, repo: Path,
                                                      headers_root: Path) -> None:
    root = make_node(tmp_path / "node", headers_root)
    _boot(root, OLD)
    install = root / INSTALL_DIR
    done = _run("prepare", root, f"file://{repo}", "--kernel", RELEASE)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["state"] == "ready" and got["source"] == "built", got
    assert (got["kernel"], got["driver_version"], got["flavour"]) == (RELEASE, VERSION,
                                                                      FLAVOUR)
    assert len([e for e in events(done.stderr) if e["event"] == "package built on node"]) == 1
    ref = json.loads((install / ".cache/refs" / f"{got['digest']}.json").read_text())
    assert ref["kernel_release"] == RELEASE
    # nothing loaded, made or staged for a kernel that is not running
    kernel = json.loads((root / "proc/.fake-kernel.json").read_text())
    assert kernel["modules"] == {} and kernel["nodes"] == {}, kernel
    assert not list(root.glob("dev/nvidia*"))
    assert {p.name for p in install.iterdir()} <= {".cache", ".prepare.lock"}
    assert not list((install / ".cache/tmp").glob("run-*/*build*"))  # work area removed

    _boot(root, RELEASE)  # the mirror is gone; the fallback would compile if it had to
    booted = _run("install", root, "http://127.0.0.1:9/", "--allow-http")
    assert booted.returncode == 0, booted.stderr[-3000:]
    assert not [e for e in events(booted.stderr)
                if e["event"] in ("package built on node", "downloading")]
    state = json.loads((install / ".state.json").read_text())
    assert state["kernel_release"] == RELEASE and state["package_digest"] == got["digest"]
    assert json.loads((install / ".ready.json").read_text())["driver_version"] == VERSION
