"""The reboot fast path loads no HTTP client, no COS or upgrade code and no package builder.

Start-up time is the fast path's budget (docs/architecture.md): these modules are imported
only on the paths that need them (a download, a COS node's first install, UPGRADE_POLICY
evict/drain, the on-node build). Checked in a fresh process, after the run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from e2e import FAKENODE, add_version, make_scene, run_cli, standin_env
from httpserver import MirrorServer

VERSION = "535.261.03"
HEAVY = ("requests", "google_crc32c", "installer.upgrade.flow", "installer.node.kube",
         "installer.stages.fetch.cos", "installer.stages.fetch.download",
         "installer.packages.builder")
PROBE = ("import atexit, sys\n"
         "atexit.register(lambda: print('LOADED', *sorted(m for m in {heavy!r} "
         "if m in sys.modules), file=sys.stderr))\n"
         "import runpy\n"
         "sys.argv = [{fakenode!r}, *{args!r}]\n"
         "runpy.run_path({fakenode!r}, run_name='__main__')\n")


def test_reboot_fast_path_imports_nothing_heavy(tmp_path: Path) -> None:
    scene = make_scene(tmp_path)
    add_version(scene, VERSION)
    env = standin_env(VERSION)
    with MirrorServer(scene.repo) as server:
        first = run_cli(["install", *scene.args("--mirror", server.url, "--allow-http")], env)
        assert first.returncode == 0, first.stderr
    (scene.root / "proc" / ".fake-kernel.json").unlink(missing_ok=True)  # a reboot
    (scene.root / "proc" / "modules").write_text("")
    args = ["install", *scene.args("--mirror", "http://127.0.0.1:9/", "--allow-http")]
    done = subprocess.run([sys.executable, "-c", PROBE.format(
        heavy=HEAVY, fakenode=str(FAKENODE), args=args)], env=env, capture_output=True,
        text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "fast path" in done.stdout, done.stdout
    loaded = [line for line in done.stderr.splitlines() if line.startswith("LOADED")]
    assert loaded == ["LOADED"], loaded
