"""The CDI spec's pure parts: the lowest cdiVersion its features need (the CDI project's own
rules), and the seam the MIG partition stage joins through (extra devices in `all`)."""

from __future__ import annotations

from pathlib import PurePosixPath

from installer.installdir import cdi

GPU = cdi.CdiGpu(0, "GPU-11111111-2222-3333-4444-555555555555", "00000000:07:00.0")
NODE = cdi.Node("/dev/nvidia0", 195, 0)


def _spec(**extra: object) -> dict[str, object]:
    return {"cdiVersion": "", "kind": cdi.KIND, "devices": [
        {"name": "gpu", "containerEdits": {}}], "containerEdits": {}, **extra}


class TestMinimumVersion:
    def test_letters_only_is_the_earliest(self) -> None:
        assert cdi.minimum_version(_spec()) == "0.3.0"

    def test_a_mount_type_needs_0_4(self) -> None:
        spec = _spec(containerEdits={"mounts": [{"hostPath": "/a", "containerPath": "/a",
                                                 "type": "bind"}]})
        assert cdi.minimum_version(spec) == "0.4.0"

    def test_a_digit_first_name_or_a_host_path_needs_0_5(self) -> None:
        assert cdi.minimum_version(_spec(devices=[{"name": "0", "containerEdits": {}}])) \
            == "0.5.0"
        edits = {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/y"}]}
        assert cdi.minimum_version(_spec(containerEdits=edits)) == "0.5.0"

    def test_annotations_need_0_6(self) -> None:
        assert cdi.minimum_version(_spec(annotations={"a": "b"})) == "0.6.0"


def test_extra_devices_join_all_once() -> None:
    """A MIG device (as the partition stage would hand it) is addressable by its own name
    and joins `all`; its parent's node is listed once."""
    mig = {"name": "0:0", "containerEdits": {"deviceNodes": [
        NODE.entry(), cdi.Node("/dev/nvidia-caps/nvidia-cap21", 508, 21).entry()]}}
    spec = cdi.build_spec(install_dir=PurePosixPath("/opt/nvidia"), version="v", gpus=[(GPU, NODE)],
                          shared=[], parts=frozenset({"lib64"}), driver_version="535.261.03",
                          extra_devices=[mig])
    names = [d["name"] for d in spec["devices"]]
    assert names == ["0", GPU.uuid, "0:0", "all"]
    assert [n["path"] for n in spec["devices"][-1]["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21"]
    assert spec["containerEdits"]["mounts"] == [{
        "hostPath": "/opt/nvidia/.versions/v/lib64", "containerPath": "/usr/local/nvidia/lib64",
        "options": ["ro", "nosuid", "nodev", "bind"]}]
    assert spec["cdiVersion"] == "0.5.0"


def test_a_version_name_that_leaves_versions_gives_no_spec(tmp_path: object) -> None:
    """`.current -> ..` would make `.versions/..` the mounted directory: no spec instead."""
    from pathlib import Path

    from installer.node.host import Roots
    from installer.testing.kernel import FakeKernelHost

    root = Path(str(tmp_path))
    host = FakeKernelHost(Roots(root, root / "proc", root / "sys", root / "dev"))
    host.mknod_char(root / "dev" / "nvidia0", 195, 0, 0o666)
    assert cdi.node_spec(host, PurePosixPath("/opt/nvidia"), "v", [GPU]) is not None
    for name in ("..", ".", "", "a/b"):
        assert cdi.node_spec(host, PurePosixPath("/opt/nvidia"), name, [GPU]) is None
