"""MIG devices in the CDI spec (issues 26 + 27): after a real `install` with a MIG config on
the NVML stand-in, the spec the signal stage wrote names each MIG device as `nvidia-ctk cdi
generate` does (`<gpu>:<mig index>` and `MIG-<uuid>`), each with its GPU's node and the
access capability nodes of its GPU and compute instance, numbered as the driver's
mig-minors says and as the node's /dev has them; MIG config/monitor caps never; a GPU in
MIG mode is not offered whole. A repartition (`partition` with another config) rewrites
the spec; MIG off gives whole GPUs again. Every spec validates against the CDI schema.
Scenes (host tree, stand-in state, simulated kernel) come from test_partition.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from host.test_cdi import SPEC, validate
from host.test_partition import A100_40, H100, MigNode, device_plugin_view, mig_node
from migconfigs import MIG_PARTED

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
    config = tmp_path / "mig.yaml"
    config.write_text(MIG_PARTED)
    args = ("--mig-config-file", str(config))
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
