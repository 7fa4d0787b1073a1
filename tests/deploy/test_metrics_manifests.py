"""The agent's metrics in the manifests: the kubelet's PodResources socket reaches the agent,
read-only, where POD_RESOURCES_DIR says, in every overlay."""

from __future__ import annotations

import pytest

from deploy.manifests import (
    OVERLAYS,
    container_env,
    host_paths,
    mounts_by_volume,
    one,
    pod_spec,
    render,
)
from installer.config import SETTINGS_BY_NAME

KUBELET_DIR = "/var/lib/kubelet/pod-resources"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_mounts_the_pod_resources_socket_read_only(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    spec = pod_spec(one(docs, "DaemonSet", "gpu-node-installer"))
    (agent,) = spec["containers"]
    (volume,) = [name for name, path in host_paths(spec).items() if path == KUBELET_DIR]
    assert next(v for v in spec["volumes"] if v["name"] == volume)["hostPath"]["type"] == \
        "Directory"
    setting = SETTINGS_BY_NAME["pod_resources_dir"]
    where = container_env(agent, docs).get(setting.envvar or "") or setting.default
    assert mounts_by_volume(agent)[volume] == where
    assert [m.get("readOnly") for m in agent["volumeMounts"] if m["name"] == volume] == [True]
    # the installer has no use for it
    for init in spec["initContainers"]:
        assert volume not in mounts_by_volume(init)
