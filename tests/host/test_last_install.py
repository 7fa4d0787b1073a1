"""`.last-install.json`: every `install` that took the node lock records how it ended, for
the agent's metrics (exit code, failed stage, fast path, stage durations); `uninstall`
removes it, and the MIG records with it. Real CLI over a host tree, real HTTP mirror
(tests/e2e.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from e2e import Scene, add_version, make_scene, run_cli, standin_env
from httpserver import MirrorServer

from installer.errors import DownloadError
from installer.installdir.layout import LAST_INSTALL_FILE, MIG_REBOOT_RECORD, MIG_RECORD

V1 = "535.261.03"
DEAD = "http://127.0.0.1:9/"  # a closed port: nothing can be fetched


def install(scene: Scene, mirror: str, version: str = V1) -> subprocess.CompletedProcess[str]:
    return run_cli(["install", *scene.args("--mirror", mirror, "--driver-version", version,
                                           "--allow-http", "--output", "json")],
                   standin_env(version))


def last(scene: Scene) -> dict[str, object]:
    return dict(json.loads((scene.install_dir / LAST_INSTALL_FILE).read_text()))


def test_success_fast_path_and_failure_are_recorded(tmp_path: Path) -> None:
    scene = make_scene(tmp_path)
    add_version(scene, V1)
    with MirrorServer(scene.repo) as server:
        first = install(scene, server.url)
    assert first.returncode == 0, first.stderr
    record = last(scene)
    assert (record["exit_code"], record["fast_path"], record["stage"]) == (0, False, "")
    timings = record["timings_ms"]
    assert isinstance(timings, dict) and set(timings) >= {"detect", "fetch", "load", "verify"}
    again = install(scene, DEAD)  # a reboot: the cached package, no network
    assert again.returncode == 0, again.stderr
    assert last(scene)["fast_path"] is True
    failed = install(scene, DEAD, "535.309.01")  # another version, no mirror to fetch it
    assert failed.returncode == DownloadError.code, failed.stderr
    record = last(scene)
    assert (record["exit_code"], record["stage"], record["fast_path"]) == (
        DownloadError.code, "fetch", False)


def test_uninstall_removes_it(tmp_path: Path) -> None:
    scene = make_scene(tmp_path)
    add_version(scene, V1)
    with MirrorServer(scene.repo) as server:
        assert install(scene, server.url).returncode == 0
    assert (scene.install_dir / LAST_INSTALL_FILE).is_file()
    records = [scene.install_dir / name for name in (MIG_RECORD, MIG_REBOOT_RECORD)]
    for record in records:  # what a partition run leaves (the layout, the reboots asked)
        record.write_text("{}")
    done = run_cli(["uninstall", *scene.args()], standin_env(V1))
    assert done.returncode == 0, done.stderr
    assert not (scene.install_dir / LAST_INSTALL_FILE).exists()
    assert not any(record.exists() for record in records)
