"""The install dir and the cache dir are the installer's own.

A system directory is refused before any write; a directory holding files the installer
did not create is refused untouched; GKE's own installer's layout is moved aside into
`.pre-existing/`, logged, and put back by `uninstall`; nothing the installer did not create
is ever deleted or overwritten.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e import INSTALL_DIR

from adversarial.harness import (
    KERNEL_STATE,
    WORK_AREA,
    Arena,
    assert_ok,
    assert_refused,
    assert_untouched,
    install,
    refused_untouched,
    snapshot,
)

INSTALL = INSTALL_DIR
KERNEL = KERNEL_STATE


def kubelet_node(arena: Arena) -> None:
    """What a GKE node has around the install dir: kubelet's binaries and libraries."""
    for rel in ("home/kubernetes/bin/kubelet", "home/kubernetes/bin/crictl",
                "home/kubernetes/lib64/libfoo.so", "usr/local/bin/helper",
                "usr/local/lib64/libbar.so", "bin/sh", "lib64/ld-linux-x86-64.so.2",
                "opt/tool/bin/tool", "var/lib/kubelet/config.yaml"):
        path = arena.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{rel}: not the installer's\n")


def gke_layout(install_dir: Path) -> None:
    """What GKE's driver installer leaves in /home/kubernetes/bin/nvidia."""
    files = {"bin/nvidia-smi": "#!gke nvidia-smi\n", "bin/nvidia-debugdump": "gke\n",
             "lib64/libcuda.so.470.256.02": "gke libcuda\n",
             "lib64/libnvidia-ml.so.470.256.02": "gke nvml\n",
             "drivers/nvidia.ko": "gke module\n", "drivers/nvidia-uvm.ko": "gke uvm\n",
             "firmware/nvidia/470.256.02/gsp.bin": "gke firmware\n",
             "share/nvidia/nvidia-application-profiles-rc": "gke\n",
             "vulkan/icd.d/nvidia_icd.json": "{}\n", "bin-workdir/work/.keep": "",
             "lib64-workdir/work/.keep": "", ".cache/NVIDIA-Linux-x86_64-470.run": "run\n"}
    for rel, text in files.items():
        path = install_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (install_dir / "lib64" / "libcuda.so.1").symlink_to("libcuda.so.470.256.02")


def under(listing: dict[str, tuple[str, int, str]], prefix: str
          ) -> dict[str, tuple[str, int, str]]:
    return {k[len(prefix):]: v for k, v in listing.items() if k.startswith(prefix)}


# --- system directories -------------------------------------------------------------------

@pytest.mark.parametrize("where", ["/", "/usr/local", "/home/kubernetes",
                                   "/home/kubernetes/bin", "/etc", "/var/lib", "/opt", "/usr"])
def test_a_system_install_dir_is_refused_before_any_write(arena: Arena, where: str) -> None:
    kubelet_node(arena)
    refused_untouched(arena, lambda: install(arena, "--install-dir", where), 2,
                      f"--install-dir {where}", "system directory", allowed=(KERNEL,))


def test_an_install_dir_that_is_a_link_to_a_system_dir_is_refused(arena: Arena) -> None:
    kubelet_node(arena)
    (arena.root / INSTALL).symlink_to("/usr/local")
    refused_untouched(arena, lambda: install(arena), 2, "--install-dir",
                      "on the node: /usr/local", "system directory", allowed=(KERNEL,))


@pytest.mark.parametrize("where", ["/var/cache", "/home/kubernetes/bin", "/"])
def test_a_system_cache_dir_is_refused(arena: Arena, where: str) -> None:
    kubelet_node(arena)
    refused_untouched(arena, lambda: install(arena, "--cache-dir", where), 2,
                      f"--cache-dir {where}", "system directory", allowed=(KERNEL,))


# --- directories with content that is not the installer's -------------------------------

def test_an_install_dir_with_foreign_files_is_refused_untouched(arena: Arena) -> None:
    kubelet_node(arena)
    refused_untouched(arena, lambda: install(arena, "--install-dir", "/opt/tool"), 2,
                      "--install-dir /opt/tool", "did not create", "bin", allowed=(KERNEL,))


def test_a_kubelet_like_dir_with_bin_and_other_files_is_refused(arena: Arena) -> None:
    kubelet_node(arena)
    other = arena.root / "srv" / "gpu"
    (other / "bin").mkdir(parents=True)
    (other / "bin" / "kubelet").write_text("kubelet\n")
    (other / "config.yaml").write_text("a: 1\n")
    refused_untouched(arena, lambda: install(arena, "--install-dir", "/srv/gpu"), 2,
                      "--install-dir /srv/gpu", "config.yaml", allowed=(KERNEL,))


def test_a_cache_dir_with_foreign_content_is_refused_untouched(arena: Arena) -> None:
    cache = arena.root / "data" / "cache"
    (cache / "tmp").mkdir(parents=True)
    (cache / "tmp" / "run-1-deadbeef").mkdir()  # looks like a stale run: must survive
    (cache / "photos").mkdir()
    (cache / "photos" / "a.jpg").write_bytes(b"\xff\xd8 not the installer's")
    refused_untouched(arena, lambda: install(arena, "--cache-dir", "/data/cache"), 2,
                      "--cache-dir /data/cache", "photos", allowed=(KERNEL,))


def test_an_empty_cache_dir_is_claimed_and_reused(arena: Arena) -> None:
    (arena.root / "data" / "cache").mkdir(parents=True)
    assert_ok(install(arena, "--cache-dir", "/data/cache"))
    assert (arena.root / "data/cache/.gpu-node-installer").is_file()
    assert_ok(install(arena, "--cache-dir", "/data/cache"))


def test_a_cache_prune_keeps_files_it_did_not_create(arena: Arena) -> None:
    assert_ok(install(arena, "--cache-dir", "/data/cache"))
    cache = arena.root / "data" / "cache"
    (cache / "notes.txt").write_text("mine\n")
    (cache / "blobs" / "README").write_text("mine too\n")
    assert_ok(install(arena, "--cache-dir", "/data/cache", "--cache-keep", "1"))
    assert (cache / "notes.txt").read_text() == "mine\n"
    assert (cache / "blobs" / "README").read_text() == "mine too\n"


# --- the GKE installer's layout -----------------------------------------------------------

def test_gke_installer_files_are_moved_aside_and_logged(arena: Arena) -> None:
    gke_layout(arena.root / INSTALL)
    original = under(arena.snapshot(), f"node/{INSTALL}/")
    done = install(arena)
    assert_ok(done)
    moved = [e for e in done.events if e.get("event", "").startswith("moved the files")]
    assert len(moved) == 1 and "lib64" in moved[0]["entries"]
    backup = under(arena.snapshot(), f"node/{INSTALL}/.pre-existing/")
    assert backup == original
    assert (arena.root / INSTALL / "lib64").is_symlink()


def test_uninstall_restores_the_gke_installer_files(arena: Arena) -> None:
    gke_layout(arena.root / INSTALL)
    original = under(arena.snapshot(), f"node/{INSTALL}/")
    assert_ok(install(arena))
    done = arena.run("uninstall", *arena.args())
    assert_ok(done)
    after = under(arena.snapshot(), f"node/{INSTALL}/")
    after.pop(".lock", None)
    after.pop(".last-install.json", None)  # how the run ended, for the agent's metrics
    assert after == original
    assert any("restored" in str(e.get("event")) for e in done.events)


def test_uninstall_on_an_unclaimed_gke_layout_touches_none_of_it(arena: Arena) -> None:
    gke_layout(arena.root / INSTALL)
    before = arena.snapshot()
    done = arena.run("uninstall", *arena.args())
    assert_ok(done)
    assert_untouched(before, arena.snapshot(), (f"node/{INSTALL}/.lock", KERNEL, "node/dev/"))


def test_gke_layout_reinstall_keeps_one_backup(arena: Arena) -> None:
    gke_layout(arena.root / INSTALL)
    assert_ok(install(arena))
    assert_ok(install(arena))
    backup = arena.root / INSTALL / ".pre-existing"
    assert sorted(p.name for p in backup.iterdir())[:3] == [".cache", "bin", "bin-workdir"]
    assert (backup / "lib64" / "libcuda.so.470.256.02").read_text() == "gke libcuda\n"


# --- never delete what the installer did not create --------------------------------------

def test_uninstall_leaves_foreign_files_in_the_install_dir(arena: Arena) -> None:
    assert_ok(install(arena))
    nvidia = arena.root / INSTALL
    (nvidia / "operator-notes.txt").write_text("keep me\n")
    (nvidia / "extra").mkdir()
    (nvidia / "extra" / "tool").write_text("keep me too\n")
    done = arena.run("uninstall", *arena.args())
    assert_ok(done)
    assert (nvidia / "operator-notes.txt").read_text() == "keep me\n"
    assert (nvidia / "extra" / "tool").read_text() == "keep me too\n"
    assert not (nvidia / ".versions").exists() and not (nvidia / "lib64").exists()


def test_a_real_bin_dir_in_an_owned_install_dir_is_kept_and_restored(arena: Arena) -> None:
    assert_ok(install(arena))
    nvidia = arena.root / INSTALL
    (nvidia / "bin").unlink()
    (nvidia / "bin").mkdir()
    (nvidia / "bin" / "kubelet").write_text("kubelet\n")
    assert_ok(install(arena))
    assert (nvidia / ".pre-existing" / "bin" / "kubelet").read_text() == "kubelet\n"
    assert_ok(install(arena))  # pruning never reaches .pre-existing
    assert (nvidia / ".pre-existing" / "bin" / "kubelet").read_text() == "kubelet\n"
    assert_ok(arena.run("uninstall", *arena.args()))
    assert (nvidia / "bin" / "kubelet").read_text() == "kubelet\n"


def test_an_install_dir_from_before_the_marker_is_adopted(arena: Arena) -> None:
    assert_ok(install(arena))
    marker = arena.root / INSTALL / ".gpu-node-installer"
    marker.unlink()
    assert_ok(install(arena))
    assert marker.is_file()


def test_uninstall_refuses_a_foreign_install_dir_untouched(arena: Arena) -> None:
    kubelet_node(arena)
    refused_untouched(arena, lambda: arena.run("uninstall",
                                               *arena.args("--install-dir", "/opt/tool")),
                      2, "--install-dir /opt/tool", "did not create", allowed=(KERNEL,))


def test_a_refused_install_dir_leaves_the_kubelet_tree_byte_identical(arena: Arena) -> None:
    kubelet_node(arena)
    before = snapshot(arena.root / "home" / "kubernetes")
    done = install(arena, "--install-dir", "/home/kubernetes")
    assert_refused(done, 2, "system directory")
    assert snapshot(arena.root / "home" / "kubernetes") == before
    assert not (arena.root / "home/kubernetes/.versions").exists()
    assert WORK_AREA  # the lock file is not even created there
    assert not (arena.root / "home/kubernetes/.lock").exists()
