"""A MIG node scene for the host tier: a node tree with GPUs of one model, the driver's
repository, the NVML stand-in's MIG state in a temp dir (its capability files in the node's
/proc), run through tests/fakenode_gpus.py; and what GKE's device plugin reads of it.
Used by test_partition.py, test_mig_reboot.py, test_cdi_mig.py and test_cdi_podman.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from e2e import KERNEL, NODE, Scene, make_scene, standin_env
from httpserver import MirrorServer
from native import HERE, build_standins
from native.packages import SMI, standin_tree

from installer.packages.builder import BuildRequest, build
from installer.testing import SAMPLE_NODES, PciSpec
from installer.testing.kernel import fake_module_set

V = "535.261.03"
A100_40 = ("NVIDIA A100-SXM4-40GB", 40960, 0x20B0)
A100_80 = ("NVIDIA A100-SXM4-80GB", 81920, 0x20B2)
H100 = ("NVIDIA H100 80GB HBM3", 81559, 0x2330)
FAKENODE = Path(__file__).resolve().parent / "fakenode_gpus.py"
# PID 1 as systemd answers SIGRTMIN+5 (systemd(1), SIGNALS: "Reboots the machine"): here
# counted in the file argv[1], around the command argv[2:], whose exit code it returns.
INIT_STANDIN = """
import pathlib, signal, subprocess, sys
count = pathlib.Path(sys.argv[1])
count.write_text("0")
def reboot(signum, frame):
    count.write_text(str(int(count.read_text()) + 1))
signal.signal(signal.SIGRTMIN + 5, reboot)
sys.exit(subprocess.run(sys.argv[2:], check=False).returncode)
"""


@dataclasses.dataclass
class MigNode:
    """One node with `count` GPUs of one model, the driver's repository, the MIG state."""

    scene: Scene
    mig_dir: Path
    env: dict[str, str]
    count: int

    def run(self, command: str, *extra: str, mirror: str = "http://127.0.0.1:9/"
            ) -> subprocess.CompletedProcess[str]:
        args = [command, *self.scene.args("--output", "json", *extra)]
        if command == "install":
            args += ["--mirror", mirror, "--allow-http", "--driver-version", V]
        return subprocess.run([sys.executable, str(FAKENODE), *args], capture_output=True,
                              text=True, env=self.env, timeout=300, check=False)

    def install(self, *extra: str) -> subprocess.CompletedProcess[str]:
        with MirrorServer(self.scene.repo) as server:
            return self.run("install", *extra, mirror=server.url)

    def run_under_init(self, signals: Path, command: str, *extra: str
                       ) -> subprocess.CompletedProcess[str]:
        """`run` in a private PID namespace whose PID 1 is INIT_STANDIN: the installer's
        reboot (SIGRTMIN+5 to PID 1) reaches the stand-in, which counts it in `signals`."""
        args = [command, *self.scene.args("--output", "json", *extra)]
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                               "-c", INIT_STANDIN, str(signals), sys.executable,
                               str(FAKENODE), *args], capture_output=True, text=True,
                              env=self.env, timeout=300, check=False)

    def reboot(self, boot: str) -> None:
        """A simulated reboot: a new boot ID; the stand-in's pending MIG mode stays."""
        (self.scene.root / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")

    def stop_resets(self) -> None:
        """Every GPU reset reaches nothing: nvidia-smi -r fails (driver loaded) and the PCI
        sysfs reset file is gone (no driver), so a pending MIG mode stays pending."""
        self.env["FAKE_NVIDIA_SMI_RESET"] = "refused"
        for device in (self.scene.root / "sys/bus/pci/devices").iterdir():
            (device / "reset").unlink(missing_ok=True)

    def restore_resets(self) -> None:
        """Resets reach the stand-in again (both ways)."""
        self.env.pop("FAKE_NVIDIA_SMI_RESET", None)
        for i, address in enumerate(_addresses(self.count)):
            reset = self.scene.root / "sys/bus/pci/devices" / address / "reset"
            reset.unlink(missing_ok=True)
            reset.symlink_to(self.mig_dir / f"reset-gpu{i}")

    def smi_calls(self) -> list[str]:
        """The stand-in nvidia-smi's argument lists, one a call."""
        log = self.mig_dir.parent / "nvidia-smi.log"
        return log.read_text().splitlines() if log.exists() else []

    def gis(self, gpu: int) -> list[tuple[int, int]]:
        """The stand-in's GPU instances of one GPU: (GI id, profile constant)."""
        path = self.mig_dir / f"gpu{gpu}"
        lines = path.read_text().splitlines() if path.exists() else []
        return sorted((int(p[1]), int(p[2])) for p in (ln.split() for ln in lines)
                      if p and p[0] == "gi")

    def states(self) -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted(self.mig_dir.glob("gpu*"))}

    def record(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.scene.install_dir / ".mig.json").read_text())
        return data

    def ready(self) -> dict[str, Any] | None:
        path = self.scene.install_dir / ".ready.json"
        return json.loads(path.read_text()) if path.exists() else None

    def cap_nodes(self) -> dict[str, str]:
        caps = self.scene.root / "dev/nvidia-caps"
        return {p.name: p.read_text().strip() for p in caps.iterdir()} if caps.exists() else {}


def _addresses(count: int) -> list[str]:
    return [f"0000:{0x10 + i:02x}:00.0" for i in range(count)]


def _add_version(scene: Scene) -> None:
    """e2e's package of V, its nvidia-smi the stand-in that resets a GPU through the
    driver (native/nvml_standin_mig_smi.c: `-r -i <bus id>`)."""
    work = scene.work / f"{V}-mig"
    tree = standin_tree(work / "tree", build_standins(work / "built"), V)
    (tree / SMI).unlink()
    subprocess.run(["gcc", "-O1", "-Wall", "-Werror", "-o", str(tree / SMI),
                    str(HERE / "nvml_standin_mig_smi.c")], check=True)
    fake_module_set(work / "modules", V, kernel_release=KERNEL)
    build(BuildRequest(trees=(tree,), modules_dir=work / "modules", driver_version=V,
                       kernel_release=KERNEL, flavour="proprietary", repo=scene.repo,
                       aliases=("default", "latest"), force=True))


def mig_node(base: Path, model: tuple[str, int, int], count: int) -> MigNode:
    name, memory, device = model
    spec = dataclasses.replace(SAMPLE_NODES[NODE], pci=tuple(
        PciSpec(a, device, 0x030200, driver=None) for a in _addresses(count)))
    scene = make_scene(base, spec)
    _add_version(scene)
    mig_dir = base / "mig"
    mig_dir.mkdir()
    boot = scene.root / "proc/sys/kernel/random/boot_id"
    boot.parent.mkdir(parents=True, exist_ok=True)
    boot.write_text("boot-1\n")
    for i, address in enumerate(_addresses(count)):  # the PCI reset reaches the stand-in
        (scene.root / "sys/bus/pci/devices" / address / "reset").symlink_to(
            mig_dir / f"reset-gpu{i}")
    env = {**standin_env(V, count), "FAKE_NVML_NAMES": ",".join([name] * count),
           "FAKE_NVML_MEMORY_MIB": ",".join([str(memory)] * count),
           "FAKE_NVML_BUS_IDS": ",".join(f"0000{a}" for a in _addresses(count)),
           "FAKE_NVML_MIG_DIR": str(mig_dir), "FAKE_NVML_PROC_DIR": str(scene.root / "proc"),
           "FAKE_KERNEL_GPUS": str(count),
           "FAKE_NVIDIA_SMI_LOG": str(base / "nvidia-smi.log")}
    for unset in ("NODE_NAME", "KUBE_API_URL", "KUBERNETES_SERVICE_HOST", "UPGRADE_POLICY",
                  "MIG_CONFIG_FILE", "MIG_CONFIG", "MIG_PROFILE", "GPU_LABEL_PREFIX"):
        env.pop(unset, None)
    return MigNode(scene, mig_dir, env, count)


def device_plugin_view(root: Path, size_count: int) -> dict[str, list[str]]:
    """What GKE's device plugin (pkg/gpu/nvidia/mig) needs before it advertises slices:
    under /proc/driver/nvidia/capabilities, each gpu<N>/mig/gi<G> with `DeviceFileMinor:` in
    its access file and its ci0's, exactly `size_count` GIs per GPU, every GPU that has a
    /dev/nvidia<N> partitioned, and /dev/nvidia<N> plus both /dev/nvidia-caps/nvidia-cap<M>
    present. Returns each slice's device paths (as the plugin would hand them to a pod)."""
    caps, dev = root / "proc/driver/nvidia/capabilities", root / "dev"
    slices: dict[str, list[str]] = {}
    gpus = sorted(p for p in caps.iterdir() if p.name.startswith("gpu"))
    for gpu in gpus:
        gis = sorted(p for p in (gpu / "mig").iterdir() if p.name.startswith("gi"))
        assert len(gis) == size_count, (gpu.name, len(gis))
        for gi in gis:
            minors = [int((p / "access").read_text().split("DeviceFileMinor:")[1].split()[0])
                      for p in (gi, gi / "ci0")]
            paths = [dev / f"nvidia{gpu.name[3:]}",
                     *(dev / f"nvidia-caps/nvidia-cap{m}" for m in minors)]
            assert all(p.exists() for p in paths), paths
            slices[f"nvidia{gpu.name[3:]}/{gi.name}"] = [str(p.relative_to(root))
                                                         for p in paths]
    whole = [p for p in dev.iterdir() if p.name[6:].isdigit() and p.name.startswith("nvidia")]
    assert len(whole) == len(gpus), "not every GPU is partitioned"
    return slices
