"""`prepare --kernel RELEASE` over a host tree with a second kernel installed.

The node (FakeKernelHost) runs KERNEL; NEXT is installed beside it (/lib/modules/NEXT), not
running. prepare fetches NEXT's package from a real HTTP mirror into the cache, verified;
a rerun takes it from the cache (the mirror sees no request for a package file); a kernel
no source has is `missing` with the `package build` command; a preloaded directory comes
before the mirror; a file failing its sha256 is never cached. Nothing is ever loaded, made
or staged for NEXT: the simulated kernel's record stays empty, no /dev node appears, the
install dir holds only the cache and the lock. Then the node "boots" NEXT (the simulated
kernel's release switched) and `install` takes the package from the cache with the mirror
gone: no download. Before that boot, the running kernel's own install never takes NEXT's
package.
"""

from __future__ import annotations

import fcntl
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import kubefake
import pytest
from e2e import FAKENODE, KERNEL, Scene, add_version, events, make_scene, run_cli, standin_env
from httpserver import Fault, MirrorServer
from native import build_standins
from native.packages import standin_tree

from installer.packages.builder import BuildRequest, build
from installer.testing.kernel import fake_module_set

V1, V2 = "535.261.03", "535.309.01"
NEXT = "5.15.0-1050-gke"
KEYS = {"kernel", "arch", "driver_version", "flavour", "state", "source", "digest",
        "build_command", "error", "duration_s"}
FAILURE = {"exit_code", "slug", "stage", "message", "fix"}  # every command's -o json failure


def add_for_kernel(scene: Scene, version: str, kernel: str) -> str:
    """A package of `version` for `kernel` in the repository; returns its manifest digest."""
    work = scene.work / f"{version}-{kernel}"
    tree = standin_tree(work / "tree", build_standins(work / "built"), version)
    fake_module_set(work / "modules", version, kernel_release=kernel)
    return build(BuildRequest(trees=(tree,), modules_dir=work / "modules",
                              driver_version=version, kernel_release=kernel,
                              flavour="proprietary", repo=scene.repo,
                              aliases=("default", "latest"), force=True)).digest


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    scene = make_scene(tmp_path)
    (scene.root / "lib/modules" / NEXT).mkdir(parents=True)  # installed, not running
    return scene


def prepare(scene: Scene, mirror: str, *extra: str, kernel: str = NEXT
            ) -> subprocess.CompletedProcess[str]:
    return run_cli(["prepare", "--kernel", kernel, *scene.args(
        "--mirror", mirror, "--allow-http", "--driver-version", V1, "-o", "json", *extra)],
        standin_env(V1))


def result(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    obj = json.loads(done.stdout)
    assert isinstance(obj, dict) and set(obj) == KEYS | (FAILURE if done.returncode else set()), \
        done.stdout
    assert done.returncode == obj.get("exit_code", 0)
    return obj


def assert_nothing_loaded(scene: Scene, records: frozenset[str] = frozenset()) -> None:
    """The simulated kernel loaded no module and made no device node; nothing was staged
    and no readiness or state written: the install dir holds only the cache and the lock
    (and `records`: what a refused install keeps of its run, its lock and last-install)."""
    kernel = json.loads((scene.root / "proc/.fake-kernel.json").read_text())
    assert kernel["modules"] == {} and kernel["nodes"] == {}, kernel
    assert not list(scene.root.glob("dev/nvidia*"))
    assert {p.name for p in scene.install_dir.iterdir()} <= {".cache", ".prepare.lock",
                                                              *records}
    assert not (scene.root / "run/nvidia/validations/driver-ready").exists()


def package_requests(server: MirrorServer) -> list[str]:
    """What the mirror served of NEXT's package (its manifest and files)."""
    return [r.path for r in server.requests if f"/{NEXT}/" in r.path]


class TestFromMirror:
    def test_fetched_verified_then_cached_then_used_by_the_boot(self, scene: Scene) -> None:
        add_version(scene, V1)
        digest = add_for_kernel(scene, V1, NEXT)
        with MirrorServer(scene.repo) as server:
            first = prepare(scene, server.url)
            assert first.returncode == 0, first.stderr[-3000:]
            got = result(first)
            assert got["state"] == "ready" and got["source"] == "mirror", got
            assert got["digest"] == digest and got["kernel"] == NEXT
            assert (got["arch"], got["driver_version"], got["flavour"]) == (
                "x86_64", V1, "proprietary")
            assert got["error"] is None and got["build_command"] is None
            assert package_requests(server), "the package came from the mirror"
            refs = [json.loads(p.read_text()) for p in
                    (scene.install_dir / ".cache/refs").glob("*.json")]
            assert [r["kernel_release"] for r in refs] == [NEXT]
            stages = [e["stage"] for e in events(first.stderr)
                      if e["event"] == "stage finished"]
            assert stages == ["detect", "space", "fetch", "confirm"], stages
            assert_nothing_loaded(scene)

            served = len(server.requests)
            again = prepare(scene, server.url)
            assert again.returncode == 0, again.stderr[-3000:]
            assert result(again)["source"] == "cache"
            assert result(again)["digest"] == digest
            assert not [r.path for r in server.requests[served:] if f"/{NEXT}/" in r.path]
        assert_nothing_loaded(scene)
        # the node boots NEXT: install finds the package in the cache, the mirror is gone
        (scene.root / "proc/sys/kernel/osrelease").write_text(NEXT + "\n")
        booted = run_cli(["install", *scene.args("--mirror", "http://127.0.0.1:9/",
                                                 "--allow-http", "--driver-version", V1,
                                                 "--output", "json")], standin_env(V1))
        assert booted.returncode == 0, booted.stderr[-3000:]
        state = json.loads((scene.install_dir / ".state.json").read_text())
        assert state["kernel_release"] == NEXT and state["package_digest"] == digest
        assert not [e for e in events(booted.stderr) if e["event"] == "downloading"]

    def test_text_output_and_the_running_kernel(self, scene: Scene) -> None:
        """Without -o json: one line naming the package; the running kernel works too."""
        add_version(scene, V1)
        with MirrorServer(scene.repo) as server:
            done = run_cli(["prepare", "--kernel", KERNEL, *scene.args(
                "--mirror", server.url, "--allow-http", "--driver-version", V1)],
                standin_env(V1))
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.startswith(f"Prepared NVIDIA {V1} (proprietary) for kernel {KERNEL}")
        assert_nothing_loaded(scene)


class TestSourcesAndChecks:
    def test_preloaded_comes_before_the_mirror(self, scene: Scene) -> None:
        """The install's order: a preloaded directory holding NEXT's package wins, read in
        place and verified; the mirror is asked for nothing of NEXT's."""
        digest = add_for_kernel(scene, V1, NEXT)
        with MirrorServer(scene.repo) as server:
            done = prepare(scene, server.url, "--preloaded-dir", str(scene.repo))
            assert done.returncode == 0, done.stderr[-3000:]
            assert not package_requests(server)
        got = result(done)
        assert (got["state"], got["source"], got["digest"]) == ("ready", "preloaded", digest)
        assert_nothing_loaded(scene)

    def test_a_file_failing_its_sha256_is_never_cached(self, scene: Scene) -> None:
        """The mirror serves NEXT's nvidia.ko with one byte flipped: exit 7 (integrity),
        the file named, no ref in the cache, nothing loaded."""
        add_for_kernel(scene, V1, NEXT)
        with MirrorServer(scene.repo) as server:
            server.fault(f"/{NEXT}/{V1}/proprietary/modules/nvidia.ko",
                         Fault("corrupt", after=10, times=0))
            done = prepare(scene, server.url)
        assert done.returncode == 7, done.stderr[-3000:]
        got = result(done)
        assert got["state"] == "failed" and "nvidia.ko" in str(got["error"]), got
        assert str(got["error"]).startswith("error(integrity): ")
        assert not list((scene.install_dir / ".cache/refs").glob("*.json"))
        assert_nothing_loaded(scene)

    def test_the_running_kernel_never_takes_the_next_kernels_package(
            self, scene: Scene) -> None:
        """NEXT's package prepared in the cache; the running kernel has none anywhere: its
        install finds nothing (exit 5) and loads, makes and stages nothing."""
        add_for_kernel(scene, V1, NEXT)
        with MirrorServer(scene.repo) as server:
            assert prepare(scene, server.url).returncode == 0
            done = run_cli(["install", *scene.args("--mirror", server.url, "--allow-http",
                                                   "--driver-version", V1)],
                           standin_env(V1))
        assert done.returncode == 5, done.stderr[-3000:]
        assert KERNEL in done.stderr.splitlines()[-1]
        assert_nothing_loaded(scene, frozenset({".lock", ".last-install.json"}))


class TestMissing:
    def test_no_source_has_it_exit_5_with_the_build_command(self, scene: Scene) -> None:
        add_version(scene, V1)  # only the running kernel's package
        with MirrorServer(scene.repo) as server:
            done = prepare(scene, server.url)
        assert done.returncode == 5, done.stderr[-3000:]
        got = result(done)
        assert got["state"] == "missing" and got["source"] is None and got["digest"] is None
        command = str(got["build_command"])
        assert command.startswith("gpu-node-installer package build --nvidia-source "
                                  f"NVIDIA-Linux-x86_64-{V1}.run"), command
        assert f"/lib/modules/{NEXT}/build" in command and "--flavour proprietary" in command
        lines = [line for line in done.stderr.splitlines() if line.startswith("error(")]
        assert len(lines) == 1 and lines[0] == got["error"], done.stderr[-3000:]
        assert lines[0].startswith("error(package-not-found): [fetch] ")
        assert NEXT in lines[0] and command in lines[0]
        assert_nothing_loaded(scene)
        assert not list((scene.install_dir / ".cache/refs").glob("*.json"))

    def test_a_branch_request_names_the_driver_the_node_runs(self, scene: Scene) -> None:
        """`--driver-version 535` and no package for NEXT: the command names the 535 driver
        the running kernel was installed with; that install is left as it was."""
        add_version(scene, V1)
        with MirrorServer(scene.repo) as server:
            installed = run_cli(["install", *scene.args("--mirror", server.url, "--allow-http",
                                                        "--driver-version", V1)],
                                standin_env(V1))
            assert installed.returncode == 0, installed.stderr[-3000:]
            state = (scene.install_dir / ".state.json").read_bytes()
            done = run_cli(["prepare", "--kernel", NEXT, *scene.args(
                "--mirror", server.url, "--allow-http", "--driver-version", "535",
                "-o", "json")], standin_env(V1))
        assert done.returncode == 5, done.stderr[-3000:]
        got = result(done)
        assert got["driver_version"] == V1 and f"--driver-version {V1} " in str(
            got["build_command"])
        assert (scene.install_dir / ".state.json").read_bytes() == state

    def test_fallback_without_headers_is_missing_naming_them(self, scene: Scene) -> None:
        add_version(scene, V1)
        with MirrorServer(scene.repo) as server:
            done = prepare(scene, server.url, "--build-fallback", "auto")
        assert done.returncode == 5, done.stderr[-3000:]
        got = result(done)
        assert got["state"] == "missing" and f"linux-headers-{NEXT}" in str(got["error"])
        assert_nothing_loaded(scene)


class TestRefusals:
    def test_a_node_without_gpus_exit_3_nothing_written(self, tmp_path: Path) -> None:
        from installer.testing import SAMPLE_NODES

        scene = make_scene(tmp_path, SAMPLE_NODES["debian12-no-gpu"])
        done = run_cli(["prepare", "--kernel", NEXT, *scene.args(
            "--mirror", "http://127.0.0.1:9/", "--allow-http", "-o", "json")],
            standin_env(V1))
        assert done.returncode == 3, done.stderr[-3000:]
        assert result(done)["state"] == "failed" and "no NVIDIA GPU" in done.stderr
        assert not (scene.root / "home").exists()


class TestOnePreparation:
    def test_a_second_preparation_is_refused_at_once(self, scene: Scene) -> None:
        """`.prepare.lock` held (by this test, as a running preparation would): exit 13,
        no wait; the node lock is not involved."""
        add_version(scene, V1)
        scene.install_dir.mkdir(parents=True)
        with (scene.install_dir / ".prepare.lock").open("w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            with MirrorServer(scene.repo) as server:
                done = prepare(scene, server.url)
        assert done.returncode == 13, done.stderr[-3000:]
        got = result(done)
        assert got["state"] == "failed" and "another preparation" in str(got["error"])
        assert not (scene.install_dir / ".lock").exists()


class TestStopped:
    def test_sigterm_mid_download_is_one_failed_object_and_no_ref(self, scene: Scene) -> None:
        """The agent may stop a preparation (its pod deleted): exit 143 within seconds, the
        JSON object says failed, the cache gains no ref and keeps no temp folder."""
        add_for_kernel(scene, V1, NEXT)
        with MirrorServer(scene.repo) as server:
            server.fault(f"/{NEXT}/", Fault("stall", after=10, seconds=30, times=0))
            proc = subprocess.Popen(
                [sys.executable, str(FAKENODE), "prepare", "--kernel", NEXT, *scene.args(
                    "--mirror", server.url, "--allow-http", "--driver-version", V1,
                    "-o", "json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env=standin_env(V1))
            deadline = time.monotonic() + 60
            while not package_requests(server) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert package_requests(server), "the download began"
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=5)
        assert proc.returncode == 143, err[-3000:]
        got = json.loads(out)
        assert got["state"] == "failed" and "SIGTERM" in str(got["error"]), got
        assert not list((scene.install_dir / ".cache/refs").glob("*.json"))
        assert not list((scene.install_dir / ".cache/tmp").glob("run-*/*"))
        assert_nothing_loaded(scene)


class TestVersionRules:
    def test_the_pools_map_entry_chooses_and_no_label_is_written(self, scene: Scene) -> None:
        """DRIVER_VERSION_MAP as for install: the Node's pool picks V2 over the setting's V1;
        a preparation labels nothing (the install that boots it does)."""
        add_for_kernel(scene, V1, NEXT)
        digest = add_for_kernel(scene, V2, NEXT)
        pools = scene.work / "map.yaml"
        pools.write_text("- selector: {cloud.google.com/gke-nodepool: h200-pool}\n"
                         f"  version: '{V2}'\n")
        account = scene.work / "serviceaccount"
        account.mkdir()
        (account / "token").write_text(kubefake.TOKEN + "\n")
        node = kubefake.node_doc("a-1")
        node["metadata"].setdefault("labels", {})[  # type: ignore[index]
            "cloud.google.com/gke-nodepool"] = "h200-pool"
        cluster = kubefake.Cluster(node_name="a-1", nodes={"a-1": node})
        before = json.dumps(cluster.node()["metadata"]["labels"], sort_keys=True)
        with MirrorServer(scene.repo) as server, kubefake.serve(cluster) as api:
            done = prepare(scene, server.url, "--driver-version-map", str(pools),
                           "--node-name", "a-1", "--kube-api", api,
                           "--service-account-dir", str(account))
        assert done.returncode == 0, done.stderr[-3000:]
        got = result(done)
        assert (got["driver_version"], got["digest"], got["state"]) == (V2, digest, "ready")
        assert json.dumps(cluster.node()["metadata"]["labels"], sort_keys=True) == before
        assert cluster.errors == []
        assert_nothing_loaded(scene)
