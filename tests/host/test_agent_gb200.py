"""The agent on GB200/GB300-era nodes: IMEX=host runs the package's nvidia-imex (and status
shows IMEX's state), and an NVLink5 node in shared fabric mode has its GPUs reset once
Fabric Manager runs. The real `agent` command in a subprocess on a temp host tree, the
daemon stand-ins (tests/native/daemons.py) staged from the package, as in test_agent.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentnode import ALL, VERSION, daemon_package, make_node, wait_for
from kubefake import Cluster


class TestImex:
    """IMEX=host: the agent runs the package's nvidia-imex in the foreground with a copy of
    the domain's node list; report (the default) and a package without it are shown apart."""

    def test_host_mode_runs_imex_with_the_domains_node_list(self, tmp_path: Path) -> None:
        package = daemon_package(tmp_path / "pkg", daemons=(*ALL, "nvidia-imex"))
        node = make_node(tmp_path, package, env={"IMEX": "host"})
        nodes = node.root / "etc/nvidia-imex/nodes_config.cfg"
        nodes.parent.mkdir(parents=True)
        nodes.write_text("10.0.0.1\n10.0.0.2\n")
        done = node.run("agent", "--once")
        assert done.returncode == 0, done.stderr
        assert sorted(node.started()) == ["nv-fabricmanager", "nvidia-imex",
                                          "nvidia-persistenced"]
        flag, config = node.argv("nvidia-imex")
        assert flag == "-c" and not Path(config).is_relative_to(node.install / ".current")
        fields = dict(line.split("=", 1) for line in Path(config).read_text().splitlines())
        assert fields["DAEMONIZE"] == "0" and fields["SERVER_PORT"] == "50000"
        assert Path(fields["IMEX_NODE_CONFIG_FILE"]).read_text() == nodes.read_text()
        assert node.pid("nvidia-imex") is None  # --once stops what it started

    def test_status_shows_the_mode_the_channel_device_and_nodes(self, tmp_path: Path) -> None:
        package = daemon_package(tmp_path / "pkg", daemons=(*ALL, "nvidia-imex"))
        node = make_node(tmp_path, package, env={"IMEX": "host"})
        (node.root / "proc/devices").write_text(
            "Character devices:\n195 nvidia-frontend\n234 nvidia-caps-imex-channels\n")
        (node.root / "dev/nvidia-caps-imex-channels").mkdir(parents=True)
        (node.root / "dev/nvidia-caps-imex-channels/channel0").touch()
        done = node.run("status", "--output", "json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["imex"] == {
            "mode": "host", "driver_device_major": 234, "channels": ["channel0"],
            "package_imex": VERSION}
        human = node.run("status")
        assert f"IMEX:            IMEX=host; channels: channel0; package nvidia-imex {VERSION}" \
            in human.stdout

    def test_report_mode_starts_nothing_of_imex(self, tmp_path: Path) -> None:
        package = daemon_package(tmp_path / "pkg", daemons=(*ALL, "nvidia-imex"))
        node = make_node(tmp_path, package)
        done = node.run("agent", "--once")
        assert done.returncode == 0, done.stderr
        assert "nvidia-imex" not in node.started()

    def test_host_mode_without_the_domains_node_list_is_said_not_run(
            self, tmp_path: Path) -> None:
        package = daemon_package(tmp_path / "pkg", daemons=(*ALL, "nvidia-imex"))
        node = make_node(tmp_path, package, env={"IMEX": "host"})
        done = node.run("agent", "--once")
        assert done.returncode == 0, done.stderr
        assert "nvidia-imex" not in node.started()
        assert "IMEX_NODES_CONFIG" in done.stdout + done.stderr

    @pytest.mark.parametrize(("daemons", "imex_version", "words"), [
        (ALL, VERSION, "carries no nvidia-imex"),
        ((*ALL, "nvidia-imex"), "535.230.02", "carries nvidia-imex 535.230.02"),
    ])
    def test_host_mode_needs_imex_of_the_drivers_version(
            self, tmp_path: Path, daemons: tuple[str, ...], imex_version: str,
            words: str) -> None:
        package = daemon_package(tmp_path / "pkg", daemons=daemons, imex_version=imex_version)
        node = make_node(tmp_path, package, env={"IMEX": "host"})
        done = node.run("agent", "--once")
        assert done.returncode == 14, done.stderr
        assert words in done.stderr and "--imex" in done.stderr
        assert node.started() == []


class TestFabricModeReset:
    @pytest.mark.parametrize("refused", [False, True])
    def test_nvlink5_in_shared_fabric_mode_resets_the_gpus_once_fabric_manager_runs(
            self, tmp_path: Path, cluster: tuple[str, Cluster], refused: bool) -> None:
        """NVIDIA's driver container resets the GPUs after Fabric Manager starts with
        NVFM_CONFIG_FABRIC_MODE=1 on NVLink5 (agent/fabricreset.py): each GPU once, through
        the driver's nvidia-smi -r -i <bus id>; a refused reset is an Event, and readiness
        still follows the fabric."""
        url, api = cluster
        package = daemon_package(tmp_path / "pkg", resetting_smi=True)
        mig_dir, smi_log = tmp_path / "resets", tmp_path / "nvidia-smi.log"
        mig_dir.mkdir()
        node = make_node(tmp_path, package, env={
            "FAKE_FM_NEEDS_NVLSM": "1", "NVFM_CONFIG_FABRIC_MODE": "1",
            "FAKE_NVML_MIG_DIR": str(mig_dir), "FAKE_NVIDIA_SMI_LOG": str(smi_log),
            **({"FAKE_NVIDIA_SMI_RESET": "refused"} if refused else {})})
        vpd = node.root / "sys/class/infiniband/mlx5_0/device/vpd"
        vpd.parent.mkdir(parents=True)
        vpd.write_bytes(b"\x82\x10NVIDIA ConnectX-7\x90\x08SW_MNG\x00\x78")
        (node.root / "proc/modules").write_text(  # the driver loaded: reset through it
            "nvidia 56463360 2 - Live 0x0000000000000000\n"
            "mlx5_core 2375680 1 mlx5_ib, Live 0x0000000000000000\n"
            "ib_umad 45056 0 - Live 0x0000000000000000\n")
        with node.agent(api=url):
            wait_for(lambda: '"gpus reset for fabric mode"' in node.log(), 60)
            wait_for(lambda: node.view().get("ready") is True, 60)
            if refused:  # queued: the files first, the API after
                wait_for(lambda: any(e["reason"] == "FabricModeResetFailed"
                                     for e in api.events), 10)
        calls = smi_log.read_text().splitlines()
        assert len(calls) == 8 and all(" -r -i 0000:" in f" {c}" for c in calls), calls
        (event,) = [json.loads(line) for line in node.log().splitlines()
                    if '"gpus reset for fabric mode"' in line]
        assert event["gpus"] == 8 and len(event["failed"]) == (8 if refused else 0)
        resets = sorted(p.name for p in mig_dir.iterdir())
        assert resets == ([] if refused else [f"reset-gpu{i}" for i in range(8)])
        failed = [e for e in api.events if e["reason"] == "FabricModeResetFailed"]
        assert len(failed) == (1 if refused else 0)
        if refused:
            assert "failed for 8 of 8 GPUs" in failed[0]["message"]
