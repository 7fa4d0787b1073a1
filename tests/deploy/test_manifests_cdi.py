"""The toolkit-free overlays: the installer writes the CDI spec onto the node's
own /var/run/cdi, which the ubuntu and operator-compatible overlays mount where the
installer resolves it under HOST_ROOT (/var/run is a link to /run on systemd nodes)."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from deploy.manifests import container_env, host_paths, mounts_by_volume, one, pod_spec, render
from installer.config import SETTINGS_BY_NAME


def _installer(overlay: str) -> dict:
    spec = pod_spec(one(render(f"overlays/{overlay}"), "DaemonSet", "gpu-node-installer"))
    (installer,) = [c for c in spec["initContainers"] if c["name"] == "installer"]
    return installer


@pytest.mark.parametrize("overlay", ["ubuntu", "operator-compatible"])
def test_the_cdi_dir_is_the_nodes_own(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    spec = pod_spec(one(docs, "DaemonSet", "gpu-node-installer"))
    installer = _installer(overlay)
    env = container_env(installer, docs)
    spec_dir = env.get("CDI_SPEC_DIR") or SETTINGS_BY_NAME["cdi_spec_dir"].default
    assert spec_dir == "/var/run/cdi" and env.get("CDI", "on") == "on"
    paths = host_paths(spec)
    (volume,) = [name for name, path in paths.items() if path == spec_dir]
    resolved = PurePosixPath("/run") / PurePosixPath(spec_dir).relative_to("/var/run")
    assert mounts_by_volume(installer)[volume] == f"{env['HOST_ROOT']}{resolved}"
    volume_spec = next(v for v in spec["volumes"] if v["name"] == volume)
    assert volume_spec["hostPath"]["type"] == "DirectoryOrCreate"
