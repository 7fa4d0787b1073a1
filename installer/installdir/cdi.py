"""The Container Device Interface (CDI) spec for the staged driver: what it says.

A CDI spec is a file a container runtime reads itself (CRI-O, containerd 2.x, Podman's
`--device`, Docker 25+): with it, a runtime gives a container the driver without NVIDIA's
container toolkit. This one is shaped as NVIDIA's generator (`nvidia-ctk cdi generate`)
shapes its own, so workloads and device plugins address devices the same way: kind
`nvidia.com/gpu`, one device per GPU by NVML index (`nvidia.com/gpu=0`) and by UUID
(`=GPU-...`), and `all`; each carries `/dev/nvidia<minor>`. What every GPU container needs
is in the spec-wide edits: `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset`
(when loaded), each with the major and minor the node has now (read through the seam), the
staged version's `lib64/` and `bin/` as read-only bind mounts (`ro, nosuid, nodev, bind`)
and its firmware where the package has any.

How a container finds the libraries: we mount them where GKE's device plugin does,
`/usr/local/nvidia/{lib64,bin}` (NVIDIA's CUDA images already name both in LD_LIBRARY_PATH
and PATH), and a `createContainer` hook adds `/usr/local/nvidia/lib64` to the container's
linker cache, as NVIDIA's `update-ldcache` hook does: the spec sets no LD_LIBRARY_PATH, so
an image's own value (or a user's `-e`) is kept. NVIDIA's hooks run its `nvidia-ctk`
binary, which a node we install on does not have (COS has no toolkit); ours is a small
shell script the installer keeps in the install dir (`cdihook`). The staged directory
already holds the SONAME links (`libcuda.so.1 -> libcuda.so.<version>`), so no symlink
hook is needed.
`NVIDIA_VISIBLE_DEVICES=void`, as in NVIDIA's spec, keeps a toolkit hook (if one is still
configured) from injecting a second set.

Not in the spec: the MIG capability nodes `nvidia-caps/nvidia-cap1` (config) and `cap2`
(monitor), which would let any GPU container repartition or watch every GPU; MIG devices
come in through `extra_devices` (`cdimig`, from the partition stage's record), each with
its own GPU instance and compute instance caps.
NVSwitch nodes are Fabric Manager's, never a container's.

`cdiVersion` is the lowest whose features the spec uses (`minimum_version`): device names
that start with a digit ("0") need 0.5.0, which every CDI-reading runtime we name reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from installer.installdir import cdihook
from installer.installdir.layout import VERSIONS
from installer.node.host import Host
from installer.node.pci import bus_key

KIND = "nvidia.com/gpu"
CONTAINER_ROOT = PurePosixPath("/usr/local/nvidia")
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
ENV = ("NVIDIA_VISIBLE_DEVICES=void",)
SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
FIRMWARE_ROOT = PurePosixPath("/lib/firmware/nvidia")
_MINOR_RE = re.compile(r"^Device Minor:\s*(\d+)", re.M)
Spec = dict[str, Any]


@dataclass(frozen=True)
class CdiGpu:
    """One GPU as verification (or `.ready.json`) names it."""

    index: int
    uuid: str
    pci_bus_id: str


@dataclass(frozen=True)
class Node:
    """A character device node on the node's /dev, with the numbers it has now."""

    path: str
    major: int
    minor: int

    def entry(self) -> dict[str, Any]:
        return {"path": self.path, "type": "c", "major": self.major, "minor": self.minor,
                "permissions": "rw"}


def build_spec(*, install_dir: PurePosixPath, version: str, gpus: Sequence[tuple[CdiGpu, Node]],
               shared: Sequence[Node], parts: frozenset[str], driver_version: str,
               extra_devices: Sequence[Mapping[str, Any]] = ()) -> Spec:
    """The spec document (pure: every fact is an argument).

    `version` is the version directory's name under `.versions/`; `parts` the directories
    it has (lib64, bin, firmware). `extra_devices` are whole CDI device entries (the MIG
    partition stage's); their device nodes join `all`."""
    devices: list[dict[str, Any]] = []
    for gpu, node in gpus:
        edits = {"deviceNodes": [node.entry()]}
        devices.append({"name": str(gpu.index), "containerEdits": edits})
        devices.append({"name": gpu.uuid, "containerEdits": edits})
    devices.extend(dict(extra) for extra in extra_devices)
    everything = _unique([n for d in devices for n in d["containerEdits"].get("deviceNodes", [])])
    if everything:
        devices.append({"name": "all", "containerEdits": {"deviceNodes": everything}})
    spec: Spec = {"cdiVersion": "", "kind": KIND, "devices": devices, "containerEdits": {
        "env": list(ENV), "deviceNodes": [n.entry() for n in shared],
        "mounts": _mounts(install_dir / VERSIONS / version, parts, driver_version)}}
    if "lib64" in parts:  # the libraries into the container's linker cache
        spec["containerEdits"]["hooks"] = [
            cdihook.hook_entry(install_dir, CONTAINER_ROOT / "lib64")]
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def _mounts(version_dir: PurePosixPath, parts: frozenset[str], driver_version: str
            ) -> list[dict[str, Any]]:
    """lib64 and bin where GKE's device plugin puts them; firmware where the kernel reads it."""
    places = [("lib64", CONTAINER_ROOT / "lib64"), ("bin", CONTAINER_ROOT / "bin"),
              ("firmware", FIRMWARE_ROOT / driver_version)]
    return [{"hostPath": str(version_dir / part), "containerPath": str(where),
             "options": list(MOUNT_OPTIONS)} for part, where in places if part in parts]


def _unique(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    kept = []
    for node in nodes:
        if node["path"] not in seen:
            seen.add(node["path"])
            kept.append(node)
    return kept


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest cdiVersion whose features `spec` uses (the CDI project's rules: 0.4.0
    added a mount's `type`, 0.5.0 device names starting with a digit and a device node's
    `hostPath`, 0.6.0 annotations)."""
    devices = spec.get("devices", [])
    edits = [spec.get("containerEdits", {}), *(d.get("containerEdits", {}) for d in devices)]
    if spec.get("annotations") or any(d.get("annotations") for d in devices):
        return "0.6.0"
    if any(d["name"][:1] and not d["name"][0].isalpha() for d in devices) or any(
            n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def node_spec(host: Host, install_dir: PurePosixPath, version: str, gpus: Sequence[CdiGpu],
              *, extra_devices: Sequence[Mapping[str, Any]] = ()) -> Spec | None:
    """The spec for what this node has now: `version` staged, its device nodes as the seam
    sees them. None when there is nothing to hand a container (no GPU node on /dev) or
    `version` is no directory name of ours (a doctored `.current` link: no mount leaves
    `.versions/`)."""
    if version in ("", ".", "..") or "/" in version:
        return None
    version_dir = host.roots.node(install_dir) / VERSIONS / version
    parts = frozenset(p for p in ("lib64", "bin", "firmware")
                      if (version_dir / p).is_dir() and any((version_dir / p).iterdir()))
    minors = gpu_minors(host)
    pairs = []
    for gpu in gpus:
        minor = minors.get(bus_key(gpu.pci_bus_id), gpu.index)
        node = dev_node(host, f"nvidia{minor}")
        if node is not None:
            pairs.append((gpu, node))
    if not pairs and not extra_devices:
        return None
    shared = [n for n in (dev_node(host, name) for name in SHARED_NODES) if n is not None]
    return build_spec(install_dir=install_dir, version=version, gpus=pairs, shared=shared,
                      parts=parts, driver_version=version.split("-", 1)[0],
                      extra_devices=extra_devices)


def dev_node(host: Host, name: str) -> Node | None:
    """`/dev/<name>` with its numbers, when it is a character device now."""
    numbers = host.char_device(host.roots.dev / name)
    return None if numbers is None else Node(f"/dev/{name}", numbers[0], numbers[1])


def gpu_minors(host: Host) -> dict[str, int]:
    """The driver's minor number per PCI address (`Device Minor:` in gpus/*/information)."""
    minors = {}
    for gpu in host.iterdir(host.roots.proc / "driver" / "nvidia" / "gpus"):
        match = _MINOR_RE.search(host.read_text(gpu / "information") or "")
        if match:
            minors[bus_key(gpu.name)] = int(match.group(1))
    return minors


def gpus_from(entries: object) -> list[CdiGpu]:
    """GPUs from `.ready.json`'s `gpus` list (entries that lack a field are skipped)."""
    gpus = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("index"), int) and isinstance(
                entry.get("uuid"), str) and isinstance(entry.get("pci_bus_id"), str):
            gpus.append(CdiGpu(entry["index"], entry["uuid"], entry["pci_bus_id"]))
    return gpus


def render(spec: Spec, output: str = "json") -> str:
    """JSON (what is written) or YAML (as `nvidia-ctk cdi generate` prints, for diff)."""
    if output == "yaml":
        import yaml  # type: ignore[import-untyped]  # only `cdi --output yaml` needs it

        return str(yaml.safe_dump(spec, sort_keys=False, default_flow_style=False))
    return json.dumps(spec, indent=2) + "\n"


def read_spec_file(path: Path, limit: int = 1024 * 1024) -> bytes | None:
    """A spec file's bytes (bounded), None when absent or not a regular file."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        with path.open("rb") as handle:
            return handle.read(limit)
    except OSError:
        return None
