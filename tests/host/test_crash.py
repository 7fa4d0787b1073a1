"""Crash safety: SIGKILL `install` at 100 random instants, rerun, and never see a mixed dir.

Between kills (and while each run is alive) a checker resolves `lib64` and `bin` the way
the device plugin's mount does and asserts they lead into one complete version directory.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from e2e import FAKENODE, Scene, add_version, make_scene, run_cli, standin_env
from httpserver import MirrorServer
from killstorm import check_consistent

V1, V2 = "535.261.03", "535.309.01"
KILLS = 100


class Watcher(threading.Thread):
    """Polls the install dir while a run is alive; records any inconsistency it sees."""

    def __init__(self, install_dir: Path) -> None:
        super().__init__(daemon=True)
        self.install_dir = install_dir
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.reads = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                check_consistent(self.install_dir, quiescent=False)
                self.reads += 1
            except FileNotFoundError:
                continue  # a link being replaced by rename: the next read sees the new one
            except AssertionError as exc:
                self.errors.append(str(exc))
            time.sleep(0.002)


def _start(scene: Scene, url: str, version: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(FAKENODE), "install",
         *scene.args("--mirror", url, "--allow-http", "--driver-version", version,
                     "--lock-timeout", "30")],
        env=standin_env(version), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_sigkill_at_random_instants(tmp_path: Path) -> None:
    scene = make_scene(tmp_path)
    for version in (V1, V2):
        add_version(scene, version, padding=6 * 1024 * 1024)
    rng = random.Random(int(os.environ.get("GNI_CRASH_SEED", "1234")))
    with MirrorServer(scene.repo) as server:
        start = time.monotonic()
        assert run_cli(["install", *scene.args("--mirror", server.url, "--allow-http",
                                               "--driver-version", V1)],
                       standin_env(V1)).returncode == 0
        full = time.monotonic() - start
        watcher = Watcher(scene.install_dir)
        watcher.start()
        for kill in range(KILLS):
            target = (V2, V1)[kill % 2]
            if kill % 10 == 0:  # make some runs start cold: the cache must be refilled too
                for ref in (scene.install_dir / ".cache").glob("refs/*"):
                    ref.unlink()
            proc = _start(scene, server.url, target)
            time.sleep(rng.uniform(0.0, full))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            check_consistent(scene.install_dir)
        watcher.stop.set()
        watcher.join()
        final = run_cli(["install", *scene.args("--mirror", server.url, "--allow-http",
                                                "--driver-version", V2)], standin_env(V2))
    assert final.returncode == 0, final.stderr[-2000:]
    assert watcher.errors == [], watcher.errors[:5]
    assert watcher.reads > KILLS
    assert check_consistent(scene.install_dir) == V2
    ready = json.loads((scene.install_dir / ".ready.json").read_text())
    assert ready["driver_version"] == V2
    leftovers = [p.name for p in (scene.install_dir / ".versions").iterdir()
                 if p.name.startswith((".tmp", ".old", ".clone"))]
    assert leftovers == []
