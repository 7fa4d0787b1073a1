"""Which Kubernetes pod a process runs in, from the text of its `/proc/<pid>/cgroup`.

kubelet puts every pod in a cgroup named after its UID, and the runtime puts each container
below it. The names depend on the cgroup driver and the runtime:

- systemd driver: `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with
  '_' for '-'>.slice/cri-containerd-<id>.scope` (CRI-O: `crio-<id>.scope`, dockershim and
  cri-dockerd: `docker-<id>.scope`); Guaranteed pods sit directly in `kubepods-pod<uid>.slice`;
- cgroupfs driver: `kubepods/burstable/pod<uid>/<id>` (CRI-O: `crio-<id>`);
- cgroup v1 repeats the path once per hierarchy (`4:memory:/kubepods/...`), v2 has one
  `0::/...` line; a reader inside a cgroup namespace sees the path relative to its own root
  (`0::/../../kubepods-...`), and kind/minikube nest kubelet's root (`kubelet-kubepods-...`).

So the parser looks for the pod component anywhere in the path rather than at a fixed depth.
Static pods have a 32-hex-digit UID (a hash of their manifest) instead of a UUID.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_SYSTEMD_POD = re.compile(
    rf"(?:[a-z0-9_]+-)?kubepods(?:-(besteffort|burstable))?-pod({_UID})\.slice")
_CGROUPFS_POD = re.compile(rf"pod({_UID})")
_QOS_DIRS = {"besteffort": "besteffort", "burstable": "burstable"}
_CONTAINER = re.compile(r"(?:(cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?")
_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}


@dataclass(frozen=True)
class PodCgroup:
    """The pod (and container) a process belongs to, as its cgroup path names them."""

    pod_uid: str  # as the API spells it: dashes, lower case
    qos: str  # guaranteed, burstable or besteffort
    driver: str  # systemd or cgroupfs
    container_id: str | None = None  # the runtime's 64-hex-digit id, None for pod-level
    runtime: str | None = None  # containerd, cri-o, docker; None where the name is bare


def parse(text: str) -> PodCgroup | None:
    """The pod of the first `/proc/<pid>/cgroup` line that names one, else None.

    Never raises: a process that exited mid-read, or a line in no known shape, is not in a
    pod as far as we can prove, and the caller treats it as a host process.
    """
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        found = parse_path(fields[2])
        if found is not None:
            return found
    return None


def parse_path(path: str) -> PodCgroup | None:
    """The pod named by one cgroup path (`/kubepods.slice/...`), else None."""
    parts = [part for part in path.strip().split("/") if part]
    for index, part in enumerate(parts):
        pod = _pod_component(part, parts[index - 1] if index else "")
        if pod is not None:
            uid, qos, driver = pod
            following = parts[index + 1] if index + 1 < len(parts) else ""
            container, runtime = _container(following)
            return PodCgroup(uid, qos, driver, container, runtime)
    return None


def _pod_component(part: str, parent: str) -> tuple[str, str, str] | None:
    """(uid, qos, driver) when `part` is a pod's own cgroup directory."""
    match = _SYSTEMD_POD.fullmatch(part)
    if match is not None:
        return _uid(match.group(2)), match.group(1) or "guaranteed", "systemd"
    match = _CGROUPFS_POD.fullmatch(part)
    if match is not None and (parent in _QOS_DIRS or parent == "kubepods"):
        return _uid(match.group(1)), _QOS_DIRS.get(parent, "guaranteed"), "cgroupfs"
    return None


def _uid(text: str) -> str:
    """systemd escapes '-' in unit names as '_': the API's UID has dashes."""
    return text.replace("_", "-")


def _container(part: str) -> tuple[str | None, str | None]:
    """(container id, runtime) of the component below the pod's, when it is a container."""
    match = _CONTAINER.fullmatch(part)
    if match is None:
        return None, None
    return match.group(2), _RUNTIMES.get(match.group(1) or "")
