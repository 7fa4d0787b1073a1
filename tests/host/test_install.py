"""`install` end to end over a host tree: real HTTP mirror, real files, real pynvml over the
stand-ins, simulated kernel. Fast path, faults, concurrency and never-half-installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e import FAKENODE, Scene, add_version, events, make_scene, run_cli, standin_env
from httpserver import MirrorServer

V1, V2 = "535.261.03", "535.309.01"


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    return make_scene(tmp_path)


def _install(scene: Scene, mirror: str, version: str = V1, *extra: str,
             driver: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(["install", *scene.args("--mirror", mirror, "--driver-version", version,
                                           "--allow-http", "--output", "json", *extra)],
                   standin_env(driver or version))


def _ready(scene: Scene) -> dict[str, object] | None:
    path = scene.install_dir / ".ready.json"
    return json.loads(path.read_text()) if path.exists() else None


class TestFullInstall:
    def test_install_then_fast_path_without_network(self, scene: Scene) -> None:
        add_version(scene, V1)
        with MirrorServer(scene.repo) as server:
            first = _install(scene, server.url)
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout)["fast_path"] is False
        names = [e["stage"] for e in events(first.stderr) if e["event"] == "stage finished"]
        assert names == ["detect", "fetch", "prepare", "load", "stage", "verify", "signal"]
        assert (scene.install_dir / "lib64" / "libnvidia-ml.so.1").exists()
        assert (scene.root / "dev" / "nvidiactl").exists()
        assert (scene.root / "dev" / "nvidia-uvm").exists()
        ready = _ready(scene)
        assert ready is not None and ready["driver_version"] == V1
        assert (scene.root / "run/nvidia/validations/driver-ready").exists()
        state = json.loads((scene.install_dir / ".state.json").read_text())
        assert state["driver_version"] == V1 and state["kernel_release"] == "5.15.0-1049-gke"
        # reboot-like rerun: the mirror is gone (closed port), nothing is fetched
        second = _install(scene, "http://127.0.0.1:9/")
        assert second.returncode == 0, second.stderr
        assert json.loads(second.stdout)["fast_path"] is True
        assert _ready(scene) is not None

    def test_fast_path_clears_a_killed_runs_downloads(self, scene: Scene) -> None:
        """A run killed mid-download leaves its temp folder; a reboot that reuses the cached
        package opens no download run, and must still give that disk space back."""
        add_version(scene, V1)
        with MirrorServer(scene.repo) as server:
            assert _install(scene, server.url).returncode == 0
        tmp = scene.install_dir / ".cache" / "tmp"
        (tmp / "run-99999-deadbeef").mkdir(parents=True)
        (tmp / "run-99999-deadbeef" / "runfile.part").write_bytes(b"\0" * 4096)
        (tmp / "run-99999-deadbeef.lock").touch()
        second = _install(scene, "http://127.0.0.1:9/")
        assert second.returncode == 0, second.stderr
        assert json.loads(second.stdout)["fast_path"] is True
        assert list(tmp.iterdir()) == []

    def test_upgrade_switches_version(self, scene: Scene) -> None:
        add_version(scene, V1)
        add_version(scene, V2)
        with MirrorServer(scene.repo) as server:
            assert _install(scene, server.url, V1).returncode == 0
            upgrade = _install(scene, server.url, V2)
        assert upgrade.returncode == 0, upgrade.stderr
        assert os.readlink(scene.install_dir / ".current").endswith(V2 + "-5.15.0-1049-gke"
                                                                    "-proprietary")
        assert (scene.root / "proc/driver/nvidia/version").read_text().count(V2) == 1

    def test_no_gpu_node_exits_3_and_writes_nothing(self, tmp_path: Path) -> None:
        from installer.testing import SAMPLE_NODES, build_node

        root = tmp_path / "node"
        root.mkdir()
        build_node(root, SAMPLE_NODES["debian12-no-gpu"])
        done = run_cli(["install", "--host-root", str(root), "--proc-root", str(root / "proc"),
                        "--sys-root", str(root / "sys")], dict(os.environ))
        assert done.returncode == 3 and "no NVIDIA GPU" in done.stderr
        assert not (root / "home").exists()


class TestFaults:
    def test_mirror_down_with_package_cached(self, scene: Scene) -> None:
        add_version(scene, V1)
        with MirrorServer(scene.repo) as server:
            assert _install(scene, server.url).returncode == 0
        (scene.install_dir / ".state.json").unlink()  # no fast path: resolve again
        done = _install(scene, "http://127.0.0.1:9/")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["fast_path"] is False

    def test_corrupted_cache_blob_is_refetched(self, scene: Scene) -> None:
        digest = add_version(scene, V1)
        with MirrorServer(scene.repo) as server:
            assert _install(scene, server.url).returncode == 0
            blobs = [p for p in (scene.install_dir / ".cache").rglob("*")
                     if p.is_file() and p.stat().st_size > 1000 and digest not in p.name]
            victim = blobs[0]
            data = bytearray(victim.read_bytes())
            data[100] ^= 0xFF
            victim.chmod(0o644)
            victim.write_bytes(bytes(data))
            before = len(server.requests)
            done = _install(scene, server.url, V1, "--paranoid")
            assert done.returncode == 0, done.stderr
            assert len(server.requests) > before  # the bad blob came again from the mirror

    def test_verification_failure_keeps_old_version_ready(self, scene: Scene) -> None:
        """Same driver in another flavour whose NVML is broken: the old one goes back in."""
        add_version(scene, V1)
        add_version(scene, V1, broken_nvml=True, flavour="open", aliases=())
        with MirrorServer(scene.repo) as server:
            assert _install(scene, server.url, V1, "--flavour", "proprietary").returncode == 0
            done = _install(scene, server.url, V1, "--flavour", "open")
        assert done.returncode == 12, done.stderr
        ready = _ready(scene)
        assert ready is not None and ready["driver_version"] == V1, done.stderr[-3000:]
        assert "previous version still serving" in done.stderr

    def test_disk_full_while_staging_keeps_old_version(self, scene: Scene) -> None:
        """The install dir on a 1 MiB tmpfs (private mount namespace): v2 does not fit."""
        add_version(scene, V1)
        add_version(scene, V2, padding=2 * 1024 * 1024)
        install_dir = scene.install_dir
        install_dir.mkdir(parents=True)
        with MirrorServer(scene.repo) as server:
            common = [*scene.args("--mirror", server.url, "--allow-http",
                                  "--cache-dir", "/var/cache/gni")]
            script = (f"mount -t tmpfs -o size=1m tmpfs {install_dir} || exit 99\n"
                      f"{sys.executable} {FAKENODE} install {' '.join(common)} "
                      f"--driver-version {V1} || exit 98\n"
                      f"{sys.executable} {FAKENODE} install "
                      f"{' '.join(common)} --driver-version {V2}\necho rc=$?\n"
                      f"cat {install_dir}/.ready.json; readlink {install_dir}/.current\n")
            done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                                  text=True, env=standin_env(V1), timeout=120, check=False)
        if done.returncode == 99:
            pytest.skip("cannot mount a tmpfs here (needs root and mount namespaces)")
        assert "rc=11" in done.stdout, done.stdout + done.stderr
        assert "No space left" in done.stderr or "ENOSPC" in done.stderr or "space" in done.stderr
        assert f'"driver_version": "{V1}"' in done.stdout, done.stderr[-3000:]
        assert done.stdout.strip().endswith(f"{V1}-5.15.0-1049-gke-proprietary")


class TestConcurrency:
    def test_two_installs_at_once(self, scene: Scene) -> None:
        add_version(scene, V1, padding=8 * 1024 * 1024)
        with MirrorServer(scene.repo) as server:
            args = [sys.executable, str(FAKENODE), "install",
                    *scene.args("--mirror", server.url, "--allow-http", "--driver-version", V1,
                                "--lock-timeout", "60")]
            procs = [subprocess.Popen(args, env=standin_env(V1), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for _ in range(2)]
            outputs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outputs
        waited = [err for _, err in outputs if "waiting for the node lock" in err]
        assert len(waited) == 1
        assert _ready(scene) is not None

    def test_lock_held_names_pid(self, scene: Scene) -> None:
        add_version(scene, V1)
        holder = subprocess.Popen(
            [sys.executable, "-c", "import sys,time; from pathlib import Path; "
             "from installer.node.lock import node_lock\n"
             f"with node_lock(Path('{scene.install_dir}/.lock'), timeout=5):\n"
             "    print('held', flush=True); time.sleep(60)"],
            stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            done = _install(scene, "http://127.0.0.1:9/", V1, "--lock-timeout", "0.5")
        finally:
            holder.kill()
            holder.wait()
        assert done.returncode == 13 and f"PID {holder.pid}" in done.stderr


class TestUninstall:
    def test_uninstall_removes_everything(self, scene: Scene) -> None:
        add_version(scene, V1)
        with MirrorServer(scene.repo) as server:
            assert _install(scene, server.url).returncode == 0
        (scene.install_dir / ".agent.json").write_text("{}")  # the node agent's view and
        (scene.install_dir / ".agent" / "logs").mkdir(parents=True)  # work area go too
        done = run_cli(["uninstall", *scene.args()], standin_env(V1))
        assert done.returncode == 0, done.stderr
        assert not (scene.install_dir / ".agent.json").exists()
        assert not (scene.install_dir / ".agent").exists()
        assert not (scene.root / "dev" / "nvidiactl").exists()
        assert not (scene.install_dir / "lib64").exists()
        assert _ready(scene) is None
        assert (scene.root / "proc" / "modules").read_text() == ""
