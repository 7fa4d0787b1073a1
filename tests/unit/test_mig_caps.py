"""stages.partition.caps: the MIG capability device nodes from mig-minors and access files.

The /proc tree is a temp dir read through the real Host seam, laid out as the driver lays
it out (`/proc/driver/nvidia-caps/mig-minors`, `/proc/driver/nvidia/capabilities/...`).
"""

from __future__ import annotations

from pathlib import Path

from installer.node.host import RealHost, Roots
from installer.stages.partition import caps

ACCESS = "DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"


def mig_minors(gpus: int = 8) -> str:
    """The driver's table: config 1, monitor 2, then per GPU 15 GIs x (access + 8 CIs)."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for gpu in range(gpus):
        for gi in range(15):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


def proc_tree(proc: Path, instances: dict[int, list[int]], *, caps_major: int = 237) -> None:
    """`/proc/devices` with nvidia-caps, mig-minors, and access files for GPU -> GIs (one CI
    each), numbered as mig-minors says."""
    (proc / "driver/nvidia-caps").mkdir(parents=True, exist_ok=True)
    table = mig_minors()
    (proc / "driver/nvidia-caps/mig-minors").write_text(table)
    (proc / "devices").write_text(f"Character devices:\n195 nvidia\n{caps_major} nvidia-caps\n")
    minors = dict(line.rsplit(" ", 1) for line in table.splitlines())
    base = proc / "driver/nvidia/capabilities"
    (base / "mig").mkdir(parents=True, exist_ok=True)
    (base / "mig/config").write_text(ACCESS.format(minor=1).replace("292", "256"))
    (base / "mig/monitor").write_text(ACCESS.format(minor=2).replace("292", "292"))
    for gpu, gis in instances.items():
        for gi in gis:
            gi_dir = base / f"gpu{gpu}/mig/gi{gi}"
            (gi_dir / "ci0").mkdir(parents=True, exist_ok=True)
            (gi_dir / "access").write_text(ACCESS.format(minor=minors[f"gpu{gpu}/gi{gi}/access"]))
            (gi_dir / "ci0/access").write_text(
                ACCESS.format(minor=minors[f"gpu{gpu}/gi{gi}/ci0/access"]))


def _host(tmp_path: Path) -> RealHost:
    return RealHost(Roots(tmp_path, tmp_path / "proc", tmp_path / "sys", tmp_path / "dev"))


class TestPlan:
    def test_seven_instances_on_one_gpu(self, tmp_path: Path) -> None:
        proc_tree(tmp_path / "proc", {0: [7, 8, 9, 10, 11, 12, 13]})
        nodes = caps.plan(_host(tmp_path))
        minors = [n.minor for n in nodes]
        # config, monitor, then each GI's access and its CI 0's access
        assert minors[:2] == [1, 2]
        assert len(nodes) == 2 + 7 * 2
        assert {n.major for n in nodes} == {237}
        assert nodes[2].name == f"nvidia-caps/nvidia-cap{3 + 7 * 9}"  # gpu0/gi7/access
        assert nodes[2].mode == 0o444
        assert nodes[0].mode == 0o400  # config: root only, as the driver says

    def test_minors_come_from_mig_minors(self, tmp_path: Path) -> None:
        """An access file whose DeviceFileMinor disagrees: mig-minors is the table."""
        proc_tree(tmp_path / "proc", {1: [1]})
        access = tmp_path / "proc/driver/nvidia/capabilities/gpu1/mig/gi1/access"
        access.write_text(ACCESS.format(minor=9999))
        minors = {n.minor for n in caps.plan(_host(tmp_path))}
        assert 3 + 15 * 9 + 9 in minors and 9999 not in minors  # gpu1/gi1/access

    def test_without_nvidia_caps_nothing(self, tmp_path: Path) -> None:
        proc_tree(tmp_path / "proc", {0: [1]})
        (tmp_path / "proc/devices").write_text("Character devices:\n195 nvidia\n")
        assert caps.plan(_host(tmp_path)) == []

    def test_no_instances_only_config_and_monitor(self, tmp_path: Path) -> None:
        proc_tree(tmp_path / "proc", {})
        assert [n.minor for n in caps.plan(_host(tmp_path))] == [1, 2]
