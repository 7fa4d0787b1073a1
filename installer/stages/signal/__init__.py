"""The signal stage: tell the node (and the cluster) that the driver is ready, or is not.

Readiness is removed before a run changes the driver (load, stage) and written last,
atomically, only from a passed verification: `<install dir>/.ready.json` for our own
`wait-ready`, and the env file `/run/nvidia/validations/driver-ready` that gpu-operator's
consumers wait for and source. Both are first held in the agent's work area; on a node with
an NVLink fabric they are published only once every GPU's fabric has completed
(`fabricgate`), else the agent publishes the held bytes when it does, and the status label
says not-ready meanwhile.
Labels, an Event and (after a load in this run, on a node with some RDMA or RDMA=on) the
condition `gpu-node-installer/RDMAReady` (nvidia-peermem loaded, or why not) are a courtesy:
failing to post them is a warning. The labels describe the GPUs too
(`installer.compat.nodelabels`), so pods can select a GPU type; they are also kept in
`.ready.json`, where `check-pod --here` reads them.
Before readiness, the CDI spec for the version in service is written (or ours removed:
CDI=off, no GPU device node), so a runtime that reads CDI has it once the node is ready;
after a repartition (`partition` signals again) it names the new MIG devices.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from installer import __version__
from installer.compat import nodelabels
from installer.compat.toolkit import max_cuda_for_driver, minor_compat_major
from installer.context import Context, Verified
from installer.errors import VerificationError
from installer.installdir import cdi, cdifile, cdimig, migrecord
from installer.installdir.layout import READY_FILE, VALIDATION_NODE_PATH
from installer.installdir.readiness import (
    clear_readiness,
    hold_readiness,
    publish,
    withdraw,
)
from installer.installdir.versions import current_name
from installer.node.optionalmods import OptionalVerdict
from installer.node.pci import bus_key
from installer.node.rdma import RdmaVerdict

LABEL_PREFIX = "gpu-node-installer"
STATUS_LABEL = f"{LABEL_PREFIX}/status"
RDMA_CONDITION = f"{LABEL_PREFIX}/RDMAReady"


class NotVerifiedError(VerificationError):
    """Something asked for readiness before verification passed."""


@dataclass(frozen=True)
class SignalResult:
    """Where readiness was written and what the cluster was told."""

    ready_file: str
    env_file: str
    labels: dict[str, str]
    warnings: tuple[str, ...]
    cdi: cdifile.Published | None = None
    held: str | None = None  # why readiness is held for the agent, not published

    def log_fields(self) -> dict[str, Any]:
        return {"ready_file": self.ready_file, "labels": bool(self.labels),
                "warnings": len(self.warnings), "published": self.held is None,
                "held": self.held, "cdi": self.cdi.action if self.cdi else None}

    def to_dict(self) -> dict[str, Any]:
        return {"ready_file": self.ready_file, "env_file": self.env_file,
                "published": self.held is None, "held": self.held,
                "labels": self.labels, "warnings": list(self.warnings),
                "cdi": self.cdi.to_dict() if self.cdi else None}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        lines = [f"Ready:           {self.ready_file}", f"Env file:        {self.env_file}"]
        if self.held is not None:
            lines.append(f"Held:            {self.held}")
        if self.cdi is not None:
            lines.append(f"CDI spec:        {self.cdi.path or 'none'} ({self.cdi.action})")
        lines += [f"Label:           {key}={value}" for key, value in self.labels.items()]
        lines += [f"Warning: {warning}" for warning in self.warnings]
        return "\n".join(lines)


def run(ctx: Context) -> SignalResult:
    """Stage entry point: only a passed verification may make the node ready."""
    verified = ctx.verified
    if verified is None or not verified.passed:
        clear_readiness(ctx.config, ctx.host.roots)
        raise NotVerifiedError("readiness not written: verification has not passed",
                               remedy="run `verify` (or `install`) and fix what it reports")
    from installer.stages.signal import fabricgate

    labels = node_labels(ctx, verified)
    document = {**ready_document(ctx, verified), "labels": labels}
    published = write_cdi(ctx, verified)
    ready, env = json.dumps(document, indent=2).encode(), env_text(ctx).encode()
    hold_readiness(ctx.config, ctx.host.roots, ready, env)
    held = fabricgate.pending(ctx)
    if held is None:
        publish(ctx.config, ctx.host.roots, ready, env)
    else:
        withdraw(ctx.config, ctx.host.roots)
        labels = {**labels, STATUS_LABEL: "not-ready"}
        ctx.log.warning("readiness held for the agent", reason=held)
    warnings = (*published.warnings, *_publish(ctx, verified, labels, announce=held is None))
    return SignalResult(str(ctx.config.install_dir / READY_FILE), str(VALIDATION_NODE_PATH),
                        labels if ctx.config.node_name else {}, warnings, published, held)


def write_cdi(ctx: Context, verified: Verified) -> cdifile.Published:
    """The CDI spec for the version in service and the GPUs verification saw; a GPU the
    partition stage left in MIG mode is offered as its MIG devices (`cdimig`)."""
    version = current_name(ctx.install_root)
    spec = None
    gpus = [cdi.CdiGpu(g.index, g.uuid, g.pci_bus_id) for g in verified.gpus]
    if ctx.config.cdi == "on" and version is not None:
        spec = cdimig.node_spec(ctx.host, ctx.config.install_dir, version, gpus)
    published = cdifile.publish(ctx.config, ctx.host.roots, spec, version,
                                gpus if spec is not None else ())
    for warning in published.warnings:
        ctx.log.warning("CDI spec", detail=warning)
    return published


def ready_document(ctx: Context, verified: Verified) -> dict[str, Any]:
    """What `.ready.json` holds (a contract for `wait-ready` and operators)."""
    return {
        "driver_version": verified.driver_version,
        "cuda_version": verified.cuda_version,
        "cuda_max_toolkit": max_cuda_for_driver(verified.driver_version),
        "cuda_minor_version_compat_major": minor_compat_major(verified.driver_version),
        "kernel_release": verified.kernel_release,
        "flavour": verified.flavour,
        "package_digest": verified.digest,
        "install_dir": str(ctx.config.install_dir),
        "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name, "pci_bus_id": g.pci_bus_id}
                 for g in verified.gpus],
        "timings_ms": dict(ctx.timings_ms),
        "installer_version": __version__,
        "rdma": ctx.rdma.to_dict() if ctx.rdma is not None else None,
        "optional_modules": [v.to_dict() for v in ctx.optional],
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def env_text(ctx: Context) -> str:
    """gpu-operator's driver-ready env file: the driver root is our install dir."""
    install_dir = str(ctx.config.install_dir)
    return (f"IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT={install_dir}\n"
            f"DRIVER_ROOT_CTR_PATH=/host{install_dir}\nNVIDIA_DEV_ROOT=/\n"
            f"DEV_ROOT_CTR_PATH=/host\n")


def node_labels(ctx: Context, verified: Verified) -> dict[str, str]:
    """Driver, CUDA and status, then what the GPUs are: verify's NVML facts, with detect's
    architecture for a GPU whose compute capability NVML did not report."""
    architectures = {bus_key(g.pci_address): g.architecture for g in ctx.node_info().gpus}
    gpus = [nodelabels.GpuFacts(g.name, g.memory_total_mib or None, g.compute_capability,
                                architectures.get(bus_key(g.pci_bus_id)))
            for g in verified.gpus]
    return {f"{LABEL_PREFIX}/driver-version": verified.driver_version,
            f"{LABEL_PREFIX}/cuda-version": verified.cuda_version,
            STATUS_LABEL: "ready",
            **nodelabels.gpu_labels(gpus, driver=verified.driver_version,
                                    cuda=verified.cuda_version, flavour=verified.flavour,
                                    prefix=ctx.config.gpu_label_prefix),
            **_mig_labels(ctx)}


def _mig_labels(ctx: Context) -> dict[str, str]:
    """The slices the partition stage left (its `.mig.json`), as gpu-feature-discovery
    labels them; none without MIG."""
    record = migrecord.read(ctx.install_root)
    if record is None:
        return {}
    gpus = [nodelabels.MigFacts(str(g.get("name", "")), int(g.get("memory_mib") or 0),
                                bool(g.get("mig_enabled")),
                                tuple((str(n), int(c)) for n, c in g.get("devices") or []),
                                migrecord.attributes(g))
            for g in record["gpus"] if isinstance(g, dict)]
    return nodelabels.mig_labels(gpus, strategy=ctx.config.mig_strategy,
                                 prefix=ctx.config.gpu_label_prefix)



def rdma_condition(verdict: RdmaVerdict) -> dict[str, str]:
    """`gpu-node-installer/RDMAReady`: nvidia-peermem loaded, or why not (the GPUs' own
    readiness does not depend on it)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"type": RDMA_CONDITION, "status": "True" if verdict.ready else "False",
            "reason": verdict.reason, "message": verdict.message[:1024],
            "lastHeartbeatTime": now, "lastTransitionTime": now}


def optional_conditions(verdicts: Sequence[OptionalVerdict]) -> list[dict[str, str]]:
    """`gpu-node-installer/GDRCopyReady`, `GDSReady`: each optional module the package
    ships, loaded with its device nodes, or why not (the GPUs' readiness never waits)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return [{"type": f"{LABEL_PREFIX}/{v.condition}", "status": "True" if v.ready else "False",
             "reason": v.reason, "message": v.message[:1024], "lastHeartbeatTime": now,
             "lastTransitionTime": now} for v in verdicts if v.condition is not None]


def _publish(ctx: Context, verified: Verified, labels: dict[str, str], *,
             announce: bool) -> list[str]:
    """Label the node and (`announce`: readiness was published) post an Event when running
    in a cluster; failures are warnings."""
    node = ctx.config.node_name
    if not node:
        return []
    from installer.node import kube

    api = kube.connect(ctx.config, os.environ)
    if api is None:
        return [f"node {node} not labelled: no API server URL or service-account token"]
    message = (f"NVIDIA driver {verified.driver_version} ready on {len(verified.gpus)} GPU(s) "
               f"(CUDA {verified.cuda_version}, kernel {verified.kernel_release})")
    warnings = []
    current: tuple[dict[str, str], dict[str, str]] = ({}, {})
    try:
        current = kube.node_metadata(api, node)
    except kube.KubeError as exc:
        warnings.append(f"could not read the node's labels (stale ones stay): {exc}")
    try:
        kube.patch_node(api, node, nodelabels.label_patch(*current, labels))
    except kube.KubeError as exc:
        warnings.append(f"could not label the node: {exc}")
    try:
        if announce:
            kube.post_node_event(api, node, reason="DriverReady", message=message)
    except kube.KubeError as exc:
        warnings.append(f"could not post an Event: {exc}")
    if ctx.rdma is not None and ctx.rdma.concerns_node:
        try:
            kube.patch_node_status(api, node, [rdma_condition(ctx.rdma)])
        except kube.KubeError as exc:
            warnings.append(f"could not set the node condition {RDMA_CONDITION}: {exc}")
    conditions = optional_conditions(ctx.optional)
    if conditions:
        try:
            kube.patch_node_status(api, node, conditions)
        except kube.KubeError as exc:
            warnings.append(f"could not set the optional modules' node conditions: {exc}")
    for warning in warnings:
        ctx.log.warning("kubernetes API call failed", detail=warning)
    return warnings
