"""`check-pod --here`: this node as the pod rules see it (labels, loaded driver).

The labels `signal` wrote into `.ready.json` are the node's own; before an install has
verified the driver, they are derived from the PCI ids `detect` reads (PCI names, which may
differ from NVML's product names, so the report says where its labels came from).
"""

from __future__ import annotations

from installer.compat import nodelabels
from installer.compat.pods import NodeView
from installer.context import Context
from installer.installdir.readiness import read_ready
from installer.node import kmod


def here(ctx: Context, driver: str | None) -> NodeView:
    """Labels from readiness, else from detect; the driver given, else the loaded one."""
    loaded = kmod.loaded_driver(ctx.host)
    version = driver or (loaded.version if loaded else None)
    ready = read_ready(ctx.config, ctx.host)
    labels = ready.get("labels") if ready else None
    if isinstance(labels, dict) and labels:
        return NodeView({str(k): str(v) for k, v in labels.items()}, None, version,
                        f"{ctx.config.install_dir}/.ready.json")
    gpus = [nodelabels.GpuFacts(g.name, architecture=g.architecture)
            for g in ctx.node_info().gpus]
    derived = nodelabels.gpu_labels(gpus, driver=version or "", cuda="", flavour=None,
                                    prefix=ctx.config.gpu_label_prefix)
    return NodeView(derived, None, version, "this node's PCI ids (no verified install yet)")
