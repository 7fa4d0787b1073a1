"""node.cgroup: the pod (and container) of a process from its /proc/<pid>/cgroup text.

Samples are in the shapes real nodes write (cgroup v1 with one line per hierarchy, v2 with
`0::`; systemd and cgroupfs drivers; containerd, CRI-O and docker names; a cgroup namespace's
`..` paths; kind's nested kubelet root; static pods' hash UIDs). The v1 cgroupfs sample is a
GKE node's (UID with a GCE MAC suffix), as published in container-info's test fixtures.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from installer.node import cgroup
from installer.node.cgroup import PodCgroup

UID = "74c13223-5a00-11e9-b385-42010a80018d"
SD_UID = UID.replace("-", "_")
CID = "34dc0b5e626f2c5c4c5170e34b10e7654ce36f0fcd532739f4445baabea03376"
STATIC = "5c1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d"

V1_CGROUPFS_GKE = "\n".join(
    f"{n}:{c}:/kubepods/besteffort/pod{UID}/{CID}" for n, c in [
        (11, "devices"), (10, "perf_event"), (9, "memory"), (8, "freezer"), (7, "hugetlb"),
        (6, "cpuset"), (5, "blkio"), (4, "net_cls,net_prio"), (3, "pids"),
        (2, "cpu,cpuacct"), (1, "name=systemd")]) + "\n"
V1_SYSTEMD_DOCKER = (
    f"12:hugetlb:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD_UID}.slice"
    f"/docker-{CID}.scope\n"
    f"4:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD_UID}.slice"
    f"/docker-{CID}.scope\n"
    f"1:name=systemd:/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{SD_UID}.slice/docker-{CID}.scope\n0::/\n")

SAMPLES = {
    "v2 systemd containerd burstable": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        PodCgroup(UID, "burstable", "systemd", CID, "containerd")),
    "v2 systemd containerd guaranteed": (
        f"0::/kubepods.slice/kubepods-pod{SD_UID}.slice/cri-containerd-{CID}.scope\n",
        PodCgroup(UID, "guaranteed", "systemd", CID, "containerd")),
    "v2 systemd cri-o besteffort": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SD_UID}.slice/"
        f"crio-{CID}.scope\n",
        PodCgroup(UID, "besteffort", "systemd", CID, "cri-o")),
    "v2 systemd cri-o conmon (pod level)": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SD_UID}.slice/"
        f"crio-conmon-{CID}.scope\n",
        PodCgroup(UID, "besteffort", "systemd", None, None)),
    "v2 cgroupfs containerd burstable": (
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",
        PodCgroup(UID, "burstable", "cgroupfs", CID, None)),
    "v2 cgroupfs containerd guaranteed (k3s)": (
        f"0::/kubepods/pod{UID}/{CID}\n", PodCgroup(UID, "guaranteed", "cgroupfs", CID, None)),
    "v2 cgroupfs cri-o": (
        f"0::/kubepods/besteffort/pod{UID}/crio-{CID}\n",
        PodCgroup(UID, "besteffort", "cgroupfs", CID, "cri-o")),
    "v1 cgroupfs containerd (GKE)": (
        V1_CGROUPFS_GKE, PodCgroup(UID, "besteffort", "cgroupfs", CID, None)),
    "v1 systemd docker": (V1_SYSTEMD_DOCKER, PodCgroup(UID, "burstable", "systemd", CID,
                                                       "docker")),
    "v2 seen from inside a cgroup namespace": (
        f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{SD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        PodCgroup(UID, "besteffort", "systemd", CID, "containerd")),
    "kind: kubelet's root nested in a docker scope": (
        f"0::/system.slice/docker-{'a' * 64}.scope/kubelet.slice/kubelet-kubepods.slice/"
        f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{SD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        PodCgroup(UID, "besteffort", "systemd", CID, "containerd")),
    "static pod (hash UID)": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice/"
        f"cri-containerd-{CID}.scope\n",
        PodCgroup(STATIC, "burstable", "systemd", CID, "containerd")),
}

HOST_PROCESSES = {
    "v2 systemd service": "0::/system.slice/nvidia-persistenced.service\n",
    "v2 login session": "0::/user.slice/user-1000.slice/session-3.scope\n",
    "v2 init": "0::/init.scope\n",
    "v1 service": "12:memory:/system.slice/dcgm.service\n1:name=systemd:/system.slice/"
                  "dcgm.service\n0::/system.slice/dcgm.service\n",
    "docker outside Kubernetes": "".join(
        f"{n}:{c}:/docker/{CID}\n" for n, c in [(4, "memory"), (1, "name=systemd")]),
    "podman container": f"0::/machine.slice/libpod-{CID}.scope/container\n",
    "root of a cgroup namespace": "0::/\n",
    "empty (the process exited)": "",
    "a cgroupfs 'pod' directory outside kubepods": f"0::/system.slice/pod{UID}/{CID}\n",
}


class TestSamples:
    @pytest.mark.parametrize("name", SAMPLES)
    def test_pod_and_container(self, name: str) -> None:
        text, expected = SAMPLES[name]
        assert cgroup.parse(text) == expected

    @pytest.mark.parametrize("name", HOST_PROCESSES)
    def test_host_processes_are_in_no_pod(self, name: str) -> None:
        assert cgroup.parse(HOST_PROCESSES[name]) is None

    def test_uid_gets_the_api_spelling(self) -> None:
        found = cgroup.parse_path(f"/kubepods.slice/kubepods-pod{SD_UID}.slice")
        assert found is not None and found.pod_uid == UID and found.container_id is None


_HEX = "0123456789abcdef"
_uids = st.builds(lambda parts: "-".join(parts), st.tuples(
    *(st.text(_HEX, min_size=n, max_size=n) for n in (8, 4, 4, 4, 12))))
_cids = st.text(_HEX, min_size=64, max_size=64)
_junk = st.lists(st.text(st.characters(blacklist_characters="/\n\r", codec="utf-8"),
                         min_size=1, max_size=12).filter(lambda p: p not in (".",)),
                 max_size=3)


@st.composite
def _pod_path(draw: st.DrawFn) -> tuple[str, PodCgroup]:
    uid, cid = draw(_uids), draw(_cids)
    qos = draw(st.sampled_from(["guaranteed", "burstable", "besteffort"]))
    runtime = draw(st.sampled_from(["containerd", "cri-o", "docker", None]))
    driver = draw(st.sampled_from(["systemd", "cgroupfs"]))
    prefix = draw(st.sampled_from(["", "/..", "/../..", "/kubelet.slice"]))
    if driver == "systemd":
        scope = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker",
                 None: "cri-containerd"}[runtime]
        runtime = runtime or "containerd"
        qos_part = "" if qos == "guaranteed" else f"/kubepods-{qos}.slice"
        pod = f"kubepods{'' if qos == 'guaranteed' else '-' + qos}-pod{uid.replace('-', '_')}"
        path = f"{prefix}/kubepods.slice{qos_part}/{pod}.slice/{scope}-{cid}.scope"
    else:
        runtime = "cri-o" if runtime == "cri-o" else None
        qos_part = "" if qos == "guaranteed" else f"/{qos}"
        name = f"crio-{cid}" if runtime else cid
        path = f"{prefix}/kubepods{qos_part}/pod{uid}/{name}"
    return path, PodCgroup(uid, qos, driver, cid, runtime)


class TestProperties:
    @given(_pod_path(), st.integers(0, 12), st.sampled_from(["", "memory", "name=systemd"]))
    def test_every_naming_scheme_round_trips(self, sample: tuple[str, PodCgroup], n: int,
                                             controllers: str) -> None:
        path, expected = sample
        assert cgroup.parse(f"{n}:{controllers}:{path}\n") == expected

    @given(_pod_path(), st.lists(st.text(max_size=40).filter(lambda t: "kubepods" not in t),
                                 max_size=4))
    def test_lines_naming_no_pod_do_not_hide_the_one_that_does(
            self, sample: tuple[str, PodCgroup], noise: list[str]) -> None:
        path, expected = sample
        lines = [line for n in noise for line in n.splitlines()] + [f"0::{path}"]
        assert cgroup.parse("\n".join(lines)) == expected

    @given(st.text(max_size=300))
    def test_never_raises(self, text: str) -> None:
        found = cgroup.parse(text)
        assert found is None or found.pod_uid in text.replace("_", "-")

    @given(_junk)
    def test_paths_without_kubepods_name_no_pod(self, parts: list[str]) -> None:
        path = "/" + "/".join(p for p in parts if "pod" not in p)
        assert cgroup.parse_path(path) is None
