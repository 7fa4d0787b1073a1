"""MIG partitioning end to end: the real CLI in a subprocess over a host tree, the
real pynvml over the NVML stand-in's MIG (its state in a temp dir, its capability files in
the node's /proc), a simulated kernel, a real HTTP mirror and the strict fake API.

GKE's gpu_config.json on an 8xA100-40GB node gives 7x1g.5gb per GPU, the slice labels and
the capability device nodes GKE's device plugin mounts; a rerun changes nothing; a changed
config changes only the GPUs that differ; mig-parted's configs on H100 and A100-80GB; bad
and impossible layouts are refused with nothing changed; a GPU in use is refused (exit 10)
and freed by eviction under UPGRADE_POLICY=evict.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from e2e import events
from migconfigs import MIG_PARTED
from mignode import A100_40, A100_80, H100, MigNode, device_plugin_view, mig_node

V = "535.261.03"
P = "gpu-node-installer/"
POD_UID = "0a5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d"



def _gke_config(node: MigNode, size: str) -> None:
    path = node.scene.root / "etc/nvidia/gpu_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"GPUPartitionSize": size}))


def _stages(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [str(e["stage"]) for e in events(done.stderr) if e["event"] == "stage finished"]


def _partition_event(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    (event,) = [e for e in events(done.stderr)
                if e["event"] == "stage finished" and e["stage"] == "partition"]
    return event


def _expected_minors(gpu: int, gis: list[int]) -> set[int]:
    """mig-minors' numbering: GI access 3+135g+9i, its CI 0 one above."""
    return {m for gi in gis for m in (3 + 135 * gpu + 9 * gi, 3 + 135 * gpu + 9 * gi + 1)}


class TestGke:
    def test_eight_a100_get_seven_1g_5gb_each(self, tmp_path: Path) -> None:
        node = mig_node(tmp_path, A100_40, 8)
        _gke_config(node, "1g.5gb")
        done = node.install()
        assert done.returncode == 0, done.stderr
        assert _stages(done)[-3:] == ["verify", "partition", "signal"]
        for gpu in range(8):  # A100: mode pending, reset through sysfs, then 7 instances
            assert node.gis(gpu) == [(gi, 0) for gi in range(7, 14)], gpu
        assert all(g["devices"] == [["1g.5gb", 7]] for g in node.record()["gpus"])
        ready = node.ready()
        assert ready is not None
        labels = ready["labels"]
        assert labels[P + "gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
        assert labels[P + "gpu.count"] == "56"
        assert labels[P + "mig.strategy"] == "single"
        # a slice's figures as NVML gives them for its MIG device (the stand-in: 5000 MB
        # for 1g.5gb, 14 SMs and one copy engine a slice), as gpu-feature-discovery labels
        assert (labels[P + "gpu.memory"], labels[P + "gpu.multiprocessors"],
                labels[P + "gpu.engines.copy"], labels[P + "gpu.slices.gi"]) == (
                    "5000", "14", "1", "1")
        devices = node.record()["gpus"][0]["mig_devices"]
        assert devices[0]["profile"] == "1g.5gb"
        assert devices[0]["attributes"]["memory"] == 5000
        # the capability nodes GKE's device plugin mounts, numbered as mig-minors says
        nodes = node.cap_nodes()
        minors = {int(n.removeprefix("nvidia-cap")) for n in nodes}
        wanted = {1, 2} | {m for g in range(8) for m in _expected_minors(g, list(range(7, 14)))}
        assert minors == wanted
        majors = {v.split()[1].split(":")[0] for v in nodes.values()}
        devices = (node.scene.root / "proc/devices").read_text()
        (caps_major,) = [ln.split()[0] for ln in devices.splitlines()
                         if ln.endswith(" nvidia-caps")]
        assert majors == {caps_major}
        slices = device_plugin_view(node.scene.root, 7)
        assert len(slices) == 56
        first = 3 + 135 * 3 + 9 * 7  # mig-minors: gpu3/gi7/access, then its ci0
        assert slices["nvidia3/gi7"] == ["dev/nvidia3", f"dev/nvidia-caps/nvidia-cap{first}",
                                         f"dev/nvidia-caps/nvidia-cap{first + 1}"]
        status = node.run("status")
        assert status.returncode == 0, status.stderr
        mig = json.loads(status.stdout)["mig"]
        assert [g["devices"] for g in mig["gpus"]] == [[["1g.5gb", 7]]] * 8

        # rerun (a reboot's fast path): the layout is as wanted, nothing changes
        before = node.states()
        again = node.run("install")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["fast_path"] is True
        assert _partition_event(again)["changed"] == 0
        assert node.states() == before
        assert device_plugin_view(node.scene.root, 7) == slices

        # the config gone: MIG is no longer ours to manage; the GPUs keep their instances
        (node.scene.root / "etc/nvidia/gpu_config.json").unlink()
        unmanaged = node.run("install")
        assert unmanaged.returncode == 0, unmanaged.stderr
        assert "partition" not in _stages(unmanaged)
        assert node.states() == before
        assert not (node.scene.install_dir / ".mig.json").exists()
        ready = node.ready()
        assert ready is not None and P + "mig.strategy" not in ready["labels"]


class TestMigParted:
    @pytest.mark.parametrize("model", [H100, A100_80], ids=["h100", "a100-80gb"])
    def test_example_configs(self, tmp_path: Path, model: tuple[str, int, int]) -> None:
        node = mig_node(tmp_path, model, 2)
        config = tmp_path / "mig.yaml"
        config.write_text(MIG_PARTED)
        args = ("--mig-config-file", str(config))
        done = node.install(*args, "--mig-config", "all-1g.10gb")
        assert done.returncode == 0, done.stderr
        assert [g["devices"] for g in node.record()["gpus"]] == [[["1g.10gb", 7]]] * 2

        balanced = node.run("partition", *args, "--mig-config", "all-balanced")
        assert balanced.returncode == 0, balanced.stderr
        want = [["1g.10gb", 2], ["2g.20gb", 1], ["3g.40gb", 1]]
        assert [g["devices"] for g in node.record()["gpus"]] == [want, want]
        profiles = sorted(p for _, p in node.gis(0))
        assert profiles == [0, 0, 1, 2]  # 1g, 1g, 2g, 3g as NVML's profile constants
        ready = node.ready()  # signalled again after the change, with the new slices
        assert ready is not None
        labels = ready["labels"]
        assert labels[P + "mig.strategy"] == "mixed"  # not one size: mixed labels
        assert (labels[P + "mig-1g.10gb.count"], labels[P + "mig-2g.20gb.count"],
                labels[P + "mig-3g.40gb.count"]) == ("4", "2", "2")

        # custom: GPU 1 is already 7x1g.10gb after going back; only GPU 0 changes
        back = node.run("partition", *args, "--mig-config", "all-1g.10gb")
        assert back.returncode == 0, back.stderr
        gpu1 = (node.mig_dir / "gpu1").read_text()
        lacking = node.run("partition", *args, "--mig-config", "custom")  # names GPU 2 too
        assert lacking.returncode == 2, lacking.stderr
        assert "mig-configs.custom[2].devices names GPU 2, which this node lacks" in \
            lacking.stderr
        assert (node.mig_dir / "gpu1").read_text() == gpu1
        config.write_text(MIG_PARTED.replace("    - devices: [2]\n      mig-enabled: false\n",
                                             ""))
        custom = node.run("partition", *args, "--mig-config", "custom")
        assert custom.returncode == 0, custom.stderr
        assert json.loads(custom.stdout)["changed"] == [0]
        assert (node.mig_dir / "gpu1").read_text() == gpu1
        assert [g["devices"] for g in node.record()["gpus"]] == [[["3g.40gb", 2]],
                                                                 [["1g.10gb", 7]]]

    def test_dry_run_changes_nothing(self, tmp_path: Path) -> None:
        node = mig_node(tmp_path, H100, 2)
        plain = node.install()  # no MIG config: the stage does not run at all
        assert plain.returncode == 0, plain.stderr
        assert _stages(plain) == ["detect", "fetch", "prepare", "load", "stage", "verify",
                                  "signal"]
        assert node.states() == {}
        assert "MIG:             not configured" in node.run("status", "--output",
                                                              "text").stdout
        dry = node.run("partition", "--mig-profile", "3g.40gb", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        shown = json.loads(dry.stdout)
        assert shown["state"] == "pending" and shown["changed"] == [0, 1]
        assert "MIG 2x3g.40gb" in shown["planned"][0]
        assert node.states() == {}


class TestRefused:
    @pytest.mark.parametrize(("how", "code", "names"), [
        # A100-40GB offers no 3g.40gb: a size of other models, named (exit 2)
        ("gke-3g.40gb", 2, "3g.40gb is a MIG size of A100-80GB, H100-80GB, not of this GPU"),
        ("gke-7g", 2, "GPUPartitionSize"),  # not a profile name
        ("too-many", 14, "GPU 0"),  # 8 compute slices of 7
        ("typo", 2, "mig-configs.typo[0] has unknown field 'mig-enable'"),
    ])
    def test_nothing_changes(self, tmp_path: Path, how: str, code: int, names: str) -> None:
        node = mig_node(tmp_path, A100_40, 2)
        extra: tuple[str, ...] = ()
        if how == "gke-3g.40gb":
            _gke_config(node, "3g.40gb")
        elif how == "gke-7g":
            (node.scene.root / "etc/nvidia").mkdir(parents=True)
            (node.scene.root / "etc/nvidia/gpu_config.json").write_text('{"GPUPartitionSize": 7}')
        else:
            config = tmp_path / "mig.yaml"
            config.write_text(MIG_PARTED + "  typo:\n    - devices: all\n      mig-enable: true\n")
            extra = ("--mig-config-file", str(config), "--mig-config", how)
        done = node.install(*extra)
        assert done.returncode == code, done.stderr
        line = done.stderr.strip().splitlines()[-1]
        assert names in line and "fix:" in line, line
        assert node.states() == {}  # no GPU touched
        assert node.ready() is None  # never ready with GPUs not as configured
        assert not (node.scene.root / "dev/nvidia-caps").exists() or not any(
            p.name != "nvidia-cap1" and p.name != "nvidia-cap2"
            for p in (node.scene.root / "dev/nvidia-caps").iterdir())


def _holder(root: Path, pid: int = 4321) -> Path:
    """A process in a pod holding /dev/nvidia0, as /proc shows it."""
    proc = root / "proc" / str(pid)
    (proc / "fd").mkdir(parents=True)
    (proc / "fd/5").symlink_to("/dev/nvidia0")
    (proc / "comm").write_text("python3\n")
    (proc / "cgroup").write_text(f"0::/kubepods/burstable/pod{POD_UID}/{'ab' * 32}\n")
    return proc


class TestInUse:
    def test_refused_then_freed_by_eviction(self, tmp_path: Path) -> None:
        from kubefake import TOKEN, Cluster, node_doc, pod_doc, serve

        node = mig_node(tmp_path, H100, 1)
        assert node.install().returncode == 0
        holder = _holder(node.scene.root)
        refused = node.run("partition", "--mig-profile", "1g.10gb")
        assert refused.returncode == 10, refused.stderr
        assert "4321 (python3)" in refused.stderr and POD_UID in refused.stderr
        assert node.states() == {}

        account = tmp_path / "sa"
        account.mkdir()
        (account / "token").write_text(TOKEN + "\n")
        name = "gpu-node-1"
        pod = pod_doc("trainer", POD_UID, name, limits={"nvidia.com/gpu": "1"})
        cluster = Cluster(nodes={name: node_doc(name)}, pods={"default/trainer": pod},
                          exits_after={"default/trainer": 0.1},
                          on_evict=lambda _pod: shutil.rmtree(holder))
        with serve(cluster) as url:
            freed = node.run("partition", "--mig-profile", "1g.10gb", "--upgrade-policy",
                             "evict", "--node-name", name, "--kube-api", url,
                             "--service-account-dir", str(account))
        assert freed.returncode == 0, freed.stderr
        assert not cluster.errors, cluster.errors
        assert any(c.path.endswith("/pods/trainer/eviction") and c.status == 201
                   for c in cluster.calls)
        assert [d for g in node.record()["gpus"] for d in g["devices"]] == [["1g.10gb", 7]]
        labels = cluster.node()["metadata"]["labels"]
        assert labels[P + "mig.config.state"] == "success"
        states = [c.body["metadata"]["labels"][P + "mig.config.state"] for c in cluster.calls
                  if c.method == "PATCH" and c.body
                  and P + "mig.config.state" in c.body.get("metadata", {}).get("labels", {})]
        assert states == ["pending", "success"]
        assert cluster.node()["spec"].get("unschedulable") is not True  # no cordon
        assert "nvidia.com/mig.config.state" not in labels  # not beside gpu-operator


class TestOperatorState:
    def test_driver_root_layout_also_writes_mig_managers_label(self, tmp_path: Path) -> None:
        """The operator-compatible overlay's mode (DRIVER_ROOT_LAYOUT=true): mig-manager's
        own nvidia.com/mig.config.state follows the stage with its values."""
        from kubefake import TOKEN, Cluster, node_doc, serve

        node = mig_node(tmp_path, H100, 1)
        assert node.install().returncode == 0
        account = tmp_path / "sa"
        account.mkdir()
        (account / "token").write_text(TOKEN + "\n")
        cluster = Cluster(nodes={"gpu-node-1": node_doc("gpu-node-1")})
        with serve(cluster) as url:
            api = ("--node-name", "gpu-node-1", "--kube-api", url, "--service-account-dir",
                   str(account), "--driver-root-layout")
            done = node.run("partition", "--mig-profile", "1g.10gb", *api)
            assert done.returncode == 0, done.stderr
            bad = node.run("partition", "--mig-profile", "1g.5gb", *api)  # an A100 size
            assert bad.returncode == 2, bad.stderr
        patched = [c.body["metadata"]["labels"] for c in cluster.calls
                   if c.method == "PATCH" and c.body
                   and "nvidia.com/mig.config.state" in c.body["metadata"].get("labels", {})]
        assert [p["nvidia.com/mig.config.state"] for p in patched] == [
            "pending", "success", "failed"]
        assert all(p[P + "mig.config.state"] == p["nvidia.com/mig.config.state"]
                   for p in patched)
        labels = cluster.node()["metadata"]["labels"]
        assert labels["nvidia.com/mig.config.state"] == "failed"
        assert labels[P + "gpu.memory"] == "10000"  # NVML's figure for the slice
        assert not cluster.errors, cluster.errors


class TestReboot:
    def test_mode_waiting_for_a_reboot(self, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
        """An A100 whose reset does not apply the mode: MIG_REBOOT=refuse stops (exit 15),
        `reboot` calls the reboot (here recorded in process: never PID 1's signal)."""
        from native.contexts import make_ctx

        from installer.pipeline.partition import make_hooks
        from installer.stages import partition
        from installer.stages.partition import MigRebootRefusedError

        node = mig_node(tmp_path, A100_40, 1)
        assert node.install().returncode == 0
        node.stop_resets()  # the reset reaches nothing: the mode stays pending
        refused = node.run("partition", "--mig-profile", "1g.5gb")
        assert refused.returncode == 15, refused.stderr
        assert "MIG_REBOOT" in refused.stderr.splitlines()[-1]
        assert node.gis(0) == []

        for key, value in node.env.items():
            monkeypatch.setenv(key, value)
        ctx = make_ctx(node.scene.root, mig_profile="1g.5gb", mig_reboot="reboot")
        calls: list[str] = []
        hooks = dataclasses.replace(make_hooks(ctx), reboot=lambda: calls.append("reboot"))
        with pytest.raises(MigRebootRefusedError) as caught:
            partition.run(ctx, hooks)
        assert calls == ["reboot"]
        assert "reboots" in caught.value.message
        assert node.gis(0) == []


class TestChangedToBad:
    def test_rerun_with_a_bad_size_withdraws_readiness(self, tmp_path: Path) -> None:
        """A ready MIG node whose config turns impossible: nothing changes on the GPUs, the
        node is no longer ready and the state label says failed."""
        from kubefake import TOKEN, Cluster, node_doc, serve

        node = mig_node(tmp_path, A100_40, 1)
        _gke_config(node, "1g.5gb")
        assert node.install().returncode == 0
        assert node.ready() is not None
        before = node.states()
        _gke_config(node, "3g.40gb")
        account = tmp_path / "sa"
        account.mkdir()
        (account / "token").write_text(TOKEN + "\n")
        cluster = Cluster(nodes={"gpu-node-1": node_doc("gpu-node-1")})
        with serve(cluster) as url:
            done = node.run("install", "--node-name", "gpu-node-1", "--kube-api", url,
                            "--service-account-dir", str(account))
        assert done.returncode == 2, done.stderr  # a size of other models, named
        assert "3g.40gb is a MIG size of A100-80GB" in done.stderr.splitlines()[-1]
        assert node.states() == before
        assert node.ready() is None
        assert cluster.node()["metadata"]["labels"][P + "mig.config.state"] == "failed"
        assert not cluster.errors, cluster.errors
