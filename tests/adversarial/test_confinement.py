"""Every write, rename and delete stays inside the host root.

A symlink on the node, absolute or relative, on the install dir, a parent of it, the cache
dir, etc/ld.so.conf.d, run/nvidia or the dev root means what it means on the node: the
installer follows it under the host root, or refuses. `arena.outside` stands for this
container's own filesystem; naive resolution of each link below would write there.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e import INSTALL_DIR

from adversarial.harness import (
    KERNEL_STATE,
    VERSION,
    WORK_AREA,
    Arena,
    Result,
    assert_ok,
    assert_refused,
    install,
    ok_on_node,
    refused_untouched,
)

INSTALL = INSTALL_DIR
KERNEL = KERNEL_STATE


def _installs_on_node(arena: Arena, *extra: str) -> None:
    """`install` succeeds and changes nothing in the arena outside the node."""
    ok_on_node(arena, lambda: install(arena, *extra))


def link(path: Path, target: str | Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def on_node(arena: Arena, container_path: Path) -> Path:
    """Where an absolute link target of the node lands under the host root."""
    return arena.root / str(container_path).lstrip("/")


def climb(frm: Path, to: Path) -> str:
    """A relative link from directory `frm` to `to`, as a naive `..` walk would follow it."""
    return os.path.relpath(to, frm)


# --- the install dir and its parents ------------------------------------------------------

def test_install_dir_absolute_link_into_the_container_lands_on_the_node(arena: Arena) -> None:
    target = arena.outside / "installed"
    link(arena.root / INSTALL, target)
    _installs_on_node(arena)
    assert (on_node(arena, target) / ".ready.json").is_file()
    assert not target.exists()


def test_install_dir_relative_link_climbing_out_is_clamped_at_the_host_root(
        arena: Arena) -> None:
    nvidia = arena.root / INSTALL
    link(nvidia, climb(nvidia.parent, arena.outside / "rel"))
    _installs_on_node(arena)
    assert (arena.root / "outside" / "rel" / "lib64").is_symlink()
    assert not (arena.outside / "rel").exists()


def test_a_parent_absolute_link_is_followed_under_the_host_root(arena: Arena) -> None:
    link(arena.root / "home" / "kubernetes", arena.outside / "k8s")
    _installs_on_node(arena)
    assert (on_node(arena, arena.outside / "k8s") / "bin/nvidia/.state.json").is_file()


def test_a_parent_relative_link_is_followed_under_the_host_root(arena: Arena) -> None:
    home = arena.root / "home"
    link(home / "kubernetes", climb(home, arena.outside / "k8s-rel"))
    _installs_on_node(arena)
    assert (arena.root / "outside" / "k8s-rel" / "bin/nvidia/.current").is_symlink()


def test_a_dangling_parent_link_creates_its_target_on_the_node(arena: Arena) -> None:
    link(arena.root / "home", "/mnt/stateful_partition/home")
    _installs_on_node(arena)
    assert (arena.root / "mnt/stateful_partition/home" / INSTALL.split("/", 1)[1]
            / ".ready.json").is_file()


def test_the_installers_own_versions_dir_as_a_link_is_refused(arena: Arena) -> None:
    assert_ok(install(arena))
    versions = arena.root / INSTALL / ".versions"
    versions.rename(arena.outside / "moved")
    link(versions, arena.outside / "moved")
    refused_untouched(arena, lambda: install(arena), 4, ".versions", "symbolic link",
                      allowed=(*WORK_AREA, KERNEL))


def test_a_lock_file_link_is_never_written_through(arena: Arena) -> None:
    link(arena.root / INSTALL / ".lock", arena.outside / "etc" / "sentinel.conf")
    refused_untouched(arena, lambda: install(arena), 11, "lock file", allowed=(KERNEL,))


@pytest.mark.parametrize("name", [".ready.json", ".state.json"])
def test_a_state_file_link_is_replaced_not_written_through(arena: Arena, name: str) -> None:
    assert_ok(install(arena))
    path = arena.root / INSTALL / name
    path.unlink()
    link(path, arena.outside / "etc" / "sentinel.conf")
    _installs_on_node(arena)
    assert not path.is_symlink() and json.loads(path.read_text())


# --- the cache dir ------------------------------------------------------------------------

def test_cache_dir_absolute_link_lands_on_the_node(arena: Arena) -> None:
    link(arena.root / "var" / "cache" / "gni", arena.outside / "cache")
    _installs_on_node(arena, "--cache-dir", "/var/cache/gni")
    assert any((on_node(arena, arena.outside / "cache") / "blobs").rglob("*"))


def test_cache_dir_relative_link_climbing_out_is_clamped(arena: Arena) -> None:
    parent = arena.root / "var" / "cache"
    link(parent / "gni", climb(parent, arena.outside / "cache-rel"))
    _installs_on_node(arena, "--cache-dir", "/var/cache/gni")
    assert (arena.root / "outside" / "cache-rel" / "refs").is_dir()


def test_cache_blobs_dir_as_a_link_is_refused(arena: Arena) -> None:
    cache = arena.root / "var" / "cache" / "gni"
    cache.mkdir(parents=True)
    link(cache / "blobs", arena.outside)
    refused_untouched(arena, lambda: install(arena, "--cache-dir", "/var/cache/gni"), 4,
                      "blobs", "symbolic link", allowed=(KERNEL,))


# --- etc/ld.so.conf.d and run/nvidia ------------------------------------------------------

def test_ld_so_conf_d_absolute_link_lands_on_the_node(arena: Arena) -> None:
    link(arena.root / "etc" / "ld.so.conf.d", arena.outside / "etc")
    _installs_on_node(arena)
    conf = on_node(arena, arena.outside / "etc") / "gpu-node-installer.conf"
    assert conf.read_text().splitlines()[-1] == f"/{INSTALL}/lib64"
    assert not (arena.outside / "etc" / "gpu-node-installer.conf").exists()


def test_ld_so_conf_d_relative_link_climbing_out_is_clamped(arena: Arena) -> None:
    etc = arena.root / "etc"
    link(etc / "ld.so.conf.d", climb(etc, arena.outside / "etc"))
    _installs_on_node(arena)
    assert (arena.root / "outside" / "etc" / "gpu-node-installer.conf").is_file()


def test_the_conf_file_as_a_link_is_replaced_not_written_through(arena: Arena) -> None:
    link(arena.root / "etc/ld.so.conf.d/gpu-node-installer.conf",
         arena.outside / "etc" / "sentinel.conf")
    _installs_on_node(arena)
    conf = arena.root / "etc/ld.so.conf.d/gpu-node-installer.conf"
    assert not conf.is_symlink() and INSTALL in conf.read_text()


def test_run_nvidia_absolute_link_lands_on_the_node(arena: Arena) -> None:
    link(arena.root / "run" / "nvidia", arena.outside / "run")
    _installs_on_node(arena)
    assert (on_node(arena, arena.outside / "run") / "validations/driver-ready").is_file()


def test_run_relative_link_climbing_out_is_clamped(arena: Arena) -> None:
    link(arena.root / "run", climb(arena.root, arena.outside / "run-rel"))
    _installs_on_node(arena)
    assert (arena.root / "outside/run-rel/nvidia/validations/driver-ready").is_file()


def test_the_validation_file_as_a_link_is_replaced(arena: Arena) -> None:
    link(arena.root / "run/nvidia/validations/driver-ready",
         arena.outside / "etc" / "sentinel.conf")
    _installs_on_node(arena)
    assert not (arena.root / "run/nvidia/validations/driver-ready").is_symlink()


# --- the dev root -------------------------------------------------------------------------

def test_dev_absolute_link_lands_on_the_node(arena: Arena) -> None:
    (arena.root / "dev").rmdir()
    link(arena.root / "dev", arena.outside / "dev")
    _installs_on_node(arena)
    assert (on_node(arena, arena.outside / "dev") / "nvidiactl").exists()
    assert not (arena.outside / "dev").exists()


def test_dev_relative_link_climbing_out_is_clamped(arena: Arena) -> None:
    (arena.root / "dev").rmdir()
    link(arena.root / "dev", climb(arena.root, arena.outside / "dev-rel"))
    _installs_on_node(arena)
    assert (arena.root / "outside" / "dev-rel" / "nvidiactl").exists()


def test_dev_char_link_gets_its_links_on_the_node(arena: Arena) -> None:
    link(arena.root / "dev" / "char", arena.outside / "bin")
    _installs_on_node(arena)
    assert any(on_node(arena, arena.outside / "bin").iterdir())


def test_uninstall_through_a_dev_char_link_deletes_nothing_outside(arena: Arena) -> None:
    assert_ok(install(arena))
    (arena.outside / "char").mkdir()
    link(arena.outside / "char" / "195:0", "../nvidia0")
    char = arena.root / "dev" / "char"
    for entry in char.iterdir():
        entry.unlink()
    char.rmdir()
    link(char, arena.outside / "char")
    ok_on_node(arena, lambda: arena.run("uninstall", *arena.args()))


def test_a_host_root_that_is_a_file_is_refused(arena: Arena) -> None:
    fake = arena.base / "host-file"
    fake.write_text("not a directory\n")
    args = arena.args("--mirror", f"file://{arena.scene.repo}")
    args[args.index("--host-root") + 1] = str(fake)
    refused_untouched(arena, lambda: arena.run("install", *args), 2, "--host-root",
                      allowed=(KERNEL,))


# --- staging never writes into the cache (item 3) ----------------------------------------

def _colliding_repo(arena: Arena) -> tuple[str, str]:
    """The repository's package plus a second `library` with libcuda's basename in another
    directory, both read-only (so the first is staged as a hard link to its cache blob)."""
    pkg = arena.scene.repo / "5.15.0-1049-gke" / VERSION / "proprietary"
    manifest = json.loads((pkg / "manifest.json").read_text())
    files = manifest["files"]
    first = next(f for f in files if f["path"].startswith("lib64/libcuda"))
    other = next(f for f in files if f["path"].startswith("lib64/libnvidia-ml"))
    first["mode"] = other["mode"] = 0o444
    (pkg / "lib64" / "extra").mkdir()
    name = Path(first["path"]).name
    (pkg / "lib64" / "extra" / name).write_bytes((pkg / other["path"]).read_bytes())
    files.append({**other, "path": f"lib64/extra/{name}"})
    data = (json.dumps(manifest, indent=1) + "\n").encode()
    (pkg / "manifest.json").write_bytes(data)
    index_path = arena.scene.repo / "index.json"
    index = json.loads(index_path.read_text())
    index["packages"][0]["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    return first["sha256"], other["sha256"]


def test_two_libraries_with_one_basename_never_rewrite_a_blob(arena: Arena) -> None:
    _colliding_repo(arena)
    refused_untouched(arena, lambda: install(arena, "--cache-dir", "/var/cache/gni"), 7,
                      "lib64/libcuda.so", allowed=("node/",))
    # Refused at validation now (before any download); whatever reached the cache is intact.
    for blob in (arena.root / "var/cache/gni/blobs/sha256").glob("*/*"):
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, blob
    assert not (arena.install_dir / "lib64").exists()


def test_staged_hard_links_into_the_cache_are_read_only(arena: Arena) -> None:
    pkg = arena.scene.repo / "5.15.0-1049-gke" / VERSION / "proprietary"
    manifest = json.loads((pkg / "manifest.json").read_text())
    for entry in manifest["files"]:
        entry["mode"] = 0o444 if entry["kind"] == "library" else entry["mode"]
    data = (json.dumps(manifest, indent=1) + "\n").encode()
    (pkg / "manifest.json").write_bytes(data)
    index = json.loads((arena.scene.repo / "index.json").read_text())
    index["packages"][0]["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    (arena.scene.repo / "index.json").write_text(json.dumps(index))
    assert_ok(install(arena))
    for lib in (arena.root / INSTALL / "lib64").iterdir():
        if not lib.is_symlink():
            assert lib.stat().st_mode & 0o222 == 0, lib


# --- a full disk (item 9) -----------------------------------------------------------------

def test_a_full_disk_names_path_and_bytes_and_the_old_version_serves(arena: Arena) -> None:
    from e2e import add_version

    big = "535.274.02"
    add_version(arena.scene, big, padding=2 * 1024 * 1024, aliases=())
    nvidia = arena.root / INSTALL
    nvidia.mkdir(parents=True)
    repo = f"file://{arena.scene.repo}"
    common = " ".join(arena.args("--mirror", repo, "--cache-dir", "/var/cache/gni"))
    fakenode = Path(__file__).resolve().parent.parent / "fakenode.py"
    script = (f"mount -t tmpfs -o size=1m tmpfs {nvidia} || exit 99\n"
              f"{sys.executable} {fakenode} install {common} --driver-version {VERSION} "
              "2>/dev/null || exit 98\n"
              f"{sys.executable} {fakenode} install {common} --driver-version {big}\n"
              "echo rc=$? >&2\n"
              f"cat {nvidia}/.ready.json; readlink {nvidia}/.current\n")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                          text=True, env=arena.env, timeout=180, check=False)
    assert done.returncode != 99, "cannot mount a tmpfs here (needs root and unshare -m)"
    stderr, _, rc = done.stderr.rpartition("rc=")
    result = Result(int(rc.strip()), done.stdout, stderr)
    assert_refused(result, 11, "no space left", f"/{INSTALL}", "bytes")
    assert f'"driver_version": "{VERSION}"' in done.stdout
    assert done.stdout.strip().endswith(f"{VERSION}-5.15.0-1049-gke-proprietary")


def test_a_blob_prefix_dir_as_a_link_is_never_written_through(arena: Arena) -> None:
    pkg = arena.scene.repo / "5.15.0-1049-gke" / VERSION / "proprietary"
    sha = json.loads((pkg / "manifest.json").read_text())["files"][0]["sha256"]
    store = arena.root / "var/cache/gni/blobs/sha256"
    link(store / sha[:2], arena.outside / "etc")
    refused_untouched(arena, lambda: install(arena, "--cache-dir", "/var/cache/gni"), 11,
                      sha[:12], "symbolic link",
                      allowed=("node/home", KERNEL, "node/var/cache/gni/"))
    assert sorted(p.name for p in (arena.outside / "etc").iterdir()) == ["sentinel.conf"]
