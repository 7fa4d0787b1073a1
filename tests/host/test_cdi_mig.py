"""MIG devices in the CDI spec: after a real `install` with a MIG config on
the NVML stand-in, the spec the signal stage wrote names each MIG device as `nvidia-ctk cdi
generate` does (`<gpu>:<mig index>` and `MIG-<uuid>`), each with its GPU's node and the
access capability nodes of its GPU and compute instance, numbered as the driver's
mig-minors says and as the node's /dev has them; MIG config/monitor caps never; a GPU in
MIG mode is not offered whole. A repartition (`partition` with another config) rewrites
the spec; MIG off gives whole GPUs again. Every spec validates against the CDI schema.
Scenes (host tree, stand-in state, simulated kernel) come from test_partition.py."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from e2e import NODE
from host.test_cdi import SPEC, validate
from migconfigs import MIG_PARTED
from mignode import A100_40, H100, MigNode, device_plugin_view, mig_node

from installer.installdir import cdi, cdimig, migrecord
from installer.node.host import RealHost, Roots
from installer.testing import SAMPLE_NODES, build_node

MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def spec_of(node: MigNode) -> dict[str, Any]:
    """The spec the signal stage wrote, validated against the CDI schema."""
    spec: dict[str, Any] = json.loads((node.scene.root / SPEC).read_text())
    validate(spec)
    return spec


def caps_major(node: MigNode) -> int:
    devices = (node.scene.root / "proc/devices").read_text().splitlines()
    (major,) = [int(ln.split()[0]) for ln in devices if ln.endswith(" nvidia-caps")]
    return major


def by_name(spec: dict[str, Any]) -> dict[str, list[tuple[str, int, int]]]:
    """Each device's nodes as (path, major, minor)."""
    return {d["name"]: [(n["path"], n["major"], n["minor"])
                        for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}


def mig_entries(node: MigNode, gpu: int, gis: list[int]) -> list[tuple[str, int, int]]:
    """What each of GPU `gpu`'s instances (GI ids `gis`, one full CI 0 each) must carry:
    /dev/nvidia<gpu> and the GI and CI access caps, mig-minors numbered (3 + 135g + 9i,
    its ci0 one above), with the nvidia-caps major."""
    major = caps_major(node)
    return [nodes for gi in gis for nodes in [
        ("/dev/nvidia-caps/nvidia-cap" + str(3 + 135 * gpu + 9 * gi), major,
         3 + 135 * gpu + 9 * gi),
        ("/dev/nvidia-caps/nvidia-cap" + str(4 + 135 * gpu + 9 * gi), major,
         4 + 135 * gpu + 9 * gi)]]


def check_mig(node: MigNode, spec: dict[str, Any], gpu: int, gis: list[int]) -> None:
    """GPU `gpu` is offered only as its MIG devices, index by index in GI order, each also
    by a MIG UUID naming the same nodes."""
    devices = by_name(spec)
    names = [d["name"] for d in spec["devices"]]
    ours = [n for n in names if n.startswith(f"{gpu}:")]
    assert ours == [f"{gpu}:{i}" for i in range(len(gis))]
    caps = mig_entries(node, gpu, gis)
    for i, name in enumerate(ours):
        assert devices[name] == [(f"/dev/nvidia{gpu}", 195, gpu), *caps[2 * i: 2 * i + 2]]
        uuid = names[names.index(name) + 1]
        assert MIG_UUID.match(uuid) and devices[uuid] == devices[name]
    assert str(gpu) not in names  # not offered whole


def uuids_of(spec: dict[str, Any], gpu: int) -> list[str]:
    """The MIG UUIDs named right after GPU `gpu`'s index names."""
    names = [d["name"] for d in spec["devices"]]
    return [names[i + 1] for i, n in enumerate(names) if n.startswith(f"{gpu}:")]


def no_control_caps(spec: dict[str, Any]) -> None:
    """MIG config (cap1) and monitor (cap2) are in no device and not spec-wide."""
    text = json.dumps(spec)
    assert '"/dev/nvidia-caps/nvidia-cap1"' not in text
    assert '"/dev/nvidia-caps/nvidia-cap2"' not in text


def test_gke_a100_install_offers_each_mig_device(tmp_path: Path) -> None:
    node = mig_node(tmp_path, A100_40, 2)
    path = node.scene.root / "etc/nvidia/gpu_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"GPUPartitionSize": "1g.5gb"}))
    done = node.install()
    assert done.returncode == 0, done.stderr
    spec = spec_of(node)
    assert spec["kind"] == "nvidia.com/gpu" and spec["cdiVersion"] == "0.5.0"
    for gpu in (0, 1):
        check_mig(node, spec, gpu, list(range(7, 14)))  # 1g instances: GI ids 7..13
    names = [d["name"] for d in spec["devices"]]
    assert len(names) == 2 * 7 * 2 + 1 and names[-1] == "all"
    uuids = [n for n in names if n.startswith("MIG-")]
    assert len(set(uuids)) == 14
    assert not any(n.startswith("GPU-") for n in names)
    no_control_caps(spec)
    # the same nodes GKE's device plugin hands a pod for each slice
    slices = device_plugin_view(node.scene.root, 7)
    offered = {tuple(p for p, _, _ in nodes) for name, nodes in by_name(spec).items()
               if ":" in name}
    assert offered == {tuple("/" + p for p in paths) for paths in slices.values()}
    every = by_name(spec)["all"]
    assert len(every) == 2 + 2 * 7 * 2 and len(set(every)) == len(every)
    # shared nodes stay spec-wide; `cdi` prints what signal wrote
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]][:1] == ["/dev/nvidiactl"]
    shown = node.run("cdi")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == spec


def test_repartition_rewrites_the_spec_and_mig_off_offers_whole_gpus(tmp_path: Path) -> None:
    node = mig_node(tmp_path, H100, 3)
    (tmp_path / "mig.yaml").write_text(MIG_PARTED)  # NVIDIA's shapes + `custom`
    args = ("--mig-config-file", str(tmp_path / "mig.yaml"))
    done = node.install(*args, "--mig-config", "all-1g.10gb")
    assert done.returncode == 0, done.stderr
    first = spec_of(node)
    for gpu in range(3):
        check_mig(node, first, gpu, list(range(7, 14)))

    # custom: GPU 0 2x3g.40gb (GI 1, 2), GPU 1 unchanged, GPU 2 MIG off: offered whole
    custom = node.run("partition", *args, "--mig-config", "custom")
    assert custom.returncode == 0, custom.stderr
    assert json.loads(custom.stdout)["changed"] == [0, 2]
    spec = spec_of(node)
    check_mig(node, spec, 0, [1, 2])
    check_mig(node, spec, 1, list(range(7, 14)))
    ready = node.ready()
    assert ready is not None
    gpu2 = ready["gpus"][2]["uuid"]
    devices = by_name(spec)
    assert devices["2"] == devices[gpu2] == [("/dev/nvidia2", 195, 2)]
    assert not any(n.startswith("2:") for n in devices)
    assert uuids_of(spec, 1) == uuids_of(first, 1)  # GPU 1's instances were kept
    assert not set(uuids_of(spec, 0)) & set(uuids_of(first, 0))  # GPU 0's are new
    no_control_caps(spec)

    # MIG off everywhere: whole GPUs again, no MIG device, no capability node
    off = node.run("partition", *args, "--mig-config", "all-disabled")
    assert off.returncode == 0, off.stderr
    whole = spec_of(node)
    assert "nvidia-caps" not in json.dumps(whole)
    ready = node.ready()
    assert ready is not None
    uuids = [g["uuid"] for g in ready["gpus"]]
    assert [d["name"] for d in whole["devices"]] == [
        "0", uuids[0], "1", uuids[1], "2", uuids[2], "all"]
    assert by_name(whole)["all"] == [(f"/dev/nvidia{g}", 195, g) for g in range(3)]


def real_node(tmp_path: Path) -> tuple[RealHost, list[cdi.CdiGpu], Path]:
    """Two H100s on real character devices whose driver minors are the reverse of NVML's
    indexes, the driver's mig-minors for gpu0..1, and the cap nodes of GI 1 / CI 0 on each
    (the partition stage's work); returns the host, the verified GPUs and the install root."""
    if os.geteuid() != 0:
        pytest.skip("mknod of character devices needs root")
    root = tmp_path / "node"
    build_node(root, SAMPLE_NODES[NODE])
    buses = ["0000:10:00.0", "0000:11:00.0"]
    for minor, bus in zip((1, 0), buses, strict=True):
        info = root / "proc/driver/nvidia/gpus" / bus / "information"
        info.parent.mkdir(parents=True, exist_ok=True)
        info.write_text(f"Model: \t\t NVIDIA H100 80GB HBM3\nDevice Minor: \t {minor}\n")
    table = root / "proc/driver/nvidia-caps/mig-minors"
    table.parent.mkdir(parents=True)
    table.write_text("config 1\nmonitor 2\n" + "".join(
        f"gpu{g}/gi{i}/access {3 + 135 * g + 9 * i}\n" + "".join(
            f"gpu{g}/gi{i}/ci{c}/access {4 + 135 * g + 9 * i + c}\n" for c in range(8))
        for g in range(2) for i in range(15)))
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    numbers = {"nvidia0": (195, 0), "nvidia1": (195, 1), "nvidiactl": (195, 255),
               **{f"nvidia-caps/nvidia-cap{m}": (237, m) for m in (1, 2, 12, 13, 147, 148)}}
    for name, (major, minor) in numbers.items():
        if (dev / name).exists():
            (dev / name).unlink()
        os.mknod(dev / name, 0o20666, os.makedev(major, minor))
    host = RealHost(Roots(root, root / "proc", root / "sys", dev))
    gpus = [cdi.CdiGpu(i, f"GPU-{i:08x}-0000-4000-8000-000000000000", f"0000{bus}".upper())
            for i, bus in enumerate(buses)]
    install_root = root / INSTALL_DIR.lstrip("/")
    (install_root / ".versions/v").mkdir(parents=True)
    return host, gpus, install_root


INSTALL_DIR = "/home/kubernetes/bin/nvidia"


def row(gpu: cdi.CdiGpu, devices: list[Any], enabled: bool = True) -> dict[str, Any]:
    """A `.mig.json` row as the partition stage writes it."""
    return {"index": gpu.index, "name": "NVIDIA H100 80GB HBM3", "uuid": gpu.uuid,
            "memory_mib": 81559, "pci_bus_id": gpu.pci_bus_id, "mig_enabled": enabled,
            "devices": [["3g.40gb", 1]], "mig_devices": devices}


def test_minors_follow_the_driver_and_a_doctored_record_names_nothing_false(
        tmp_path: Path) -> None:
    host, gpus, install_root = real_node(tmp_path)
    good = {"index": 0, "uuid": "MIG-0b7c3a4e-8d2f-5e61-9a0b-1c2d3e4f5a6b", "gi": 1, "ci": 0}
    migrecord.write(install_root, "test", [
        row(gpus[0], [good,
                      {**good, "uuid": "MIG-0b7c3a4e-8d2f-5e61-9a0b-1c2d3e4f5a6c"},  # index 0 again
                      {"index": 1, "uuid": "MIG-../../etc", "gi": 1, "ci": 0},  # no CDI name
                      {"index": 2, "uuid": "MIG-aa", "gi": 2, "ci": 0},  # no cap node on /dev
                      {"index": 3, "uuid": "MIG-bb", "gi": "1", "ci": 0},
                      {"index": -1, "uuid": "MIG-cc", "gi": 1, "ci": 0}, "junk"]),
        row(gpus[1], [{"index": 0, "uuid": "MIG-GPU-x/1/0", "gi": 1, "ci": 0}]),
        row(cdi.CdiGpu(7, "GPU-not-verified", "0000:99:00.0"), [good])])
    spec = cdimig.node_spec(host, PurePosixPath(INSTALL_DIR), "v", gpus)
    assert spec is not None
    validate(spec)
    devices = by_name(spec)
    # NVML's GPU 0 is the driver's minor 1: its node and its caps are gpu1's (3+135+9, +1)
    assert devices["0:0"] == devices[good["uuid"]] == [
        ("/dev/nvidia1", 195, 1), ("/dev/nvidia-caps/nvidia-cap147", 237, 147),
        ("/dev/nvidia-caps/nvidia-cap148", 237, 148)]
    assert devices["0:1"] == [("/dev/nvidia1", 195, 1), *devices["0:0"][1:]]
    # GPU 1 (minor 0): gpu0/gi1 = 12, ci0 = 13; an old-form UUID names nothing
    assert devices["1:0"] == [("/dev/nvidia0", 195, 0), ("/dev/nvidia-caps/nvidia-cap12", 237, 12),
                              ("/dev/nvidia-caps/nvidia-cap13", 237, 13)]
    assert list(devices) == ["0:0", good["uuid"], "0:1", "1:0", "all"]
    no_control_caps(spec)

    # the record says MIG off: whole GPUs; no record at all: the same
    migrecord.write(install_root, "test", [row(g, [], enabled=False) for g in gpus])
    whole = cdimig.node_spec(host, PurePosixPath(INSTALL_DIR), "v", gpus)
    assert whole is not None and list(by_name(whole)) == [
        "0", gpus[0].uuid, "1", gpus[1].uuid, "all"]
    migrecord.forget(install_root)
    assert cdimig.node_spec(host, PurePosixPath(INSTALL_DIR), "v", gpus) == whole
