"""The signal stage: tell the node (and the cluster) that the driver is ready, or is not.

Readiness is removed at the start of every run and written last, atomically, only from a
passed verification: `<install dir>/.ready.json` for our own `wait-ready`, and the env file
`/run/nvidia/validations/driver-ready` that gpu-operator's consumers wait for and source.
Labels and an Event on the Node are a courtesy: failing to post them is a warning.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from installer import __version__
from installer.compat import max_cuda_for_driver, minor_compat_major
from installer.errors import VerificationError
from installer.host import write_atomic

if TYPE_CHECKING:
    from installer.pipeline import Context
    from installer.verify import VerifyResult

READY_FILE = ".ready.json"
VALIDATION_NODE_PATH = PurePosixPath("/run/nvidia/validations/driver-ready")
LABEL_PREFIX = "gpu-node-installer"


class NotVerifiedError(VerificationError):
    """Something asked for readiness before verification passed."""


@dataclass(frozen=True)
class SignalResult:
    """Where readiness was written and what the cluster was told."""

    ready_file: str
    env_file: str
    labels: dict[str, str]
    warnings: tuple[str, ...]

    def log_fields(self) -> dict[str, Any]:
        return {"ready_file": self.ready_file, "labels": bool(self.labels),
                "warnings": len(self.warnings)}

    def to_dict(self) -> dict[str, Any]:
        return {"ready_file": self.ready_file, "env_file": self.env_file,
                "labels": self.labels, "warnings": list(self.warnings)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        lines = [f"Ready:           {self.ready_file}", f"Env file:        {self.env_file}"]
        lines += [f"Label:           {key}={value}" for key, value in self.labels.items()]
        lines += [f"Warning: {warning}" for warning in self.warnings]
        return "\n".join(lines)


def ready_paths(ctx: Context) -> tuple[Path, Path]:
    """`.ready.json` in the install dir and the gpu-operator env file, as paths here."""
    roots = ctx.host.roots
    return roots.node(ctx.config.install_dir) / READY_FILE, roots.node(VALIDATION_NODE_PATH)


def clear_readiness(ctx: Context) -> None:
    """Withdraw readiness: called at the start of a run and when verification fails."""
    for path in ready_paths(ctx):
        path.unlink(missing_ok=True)


def run(ctx: Context) -> SignalResult:
    """Stage entry point: only a passed verification may make the node ready."""
    verified: VerifyResult | None = ctx.results.get("verify")
    if verified is None or not verified.passed:
        clear_readiness(ctx)
        raise NotVerifiedError("readiness not written: verification has not passed",
                               remedy="run `verify` (or `install`) and fix what it reports")
    ready, env_file = ready_paths(ctx)
    write_atomic(ready, json.dumps(ready_document(ctx, verified), indent=2).encode())
    write_atomic(env_file, env_text(ctx).encode())
    labels = node_labels(verified)
    warnings = tuple(_publish(ctx, verified, labels))
    return SignalResult(str(ctx.config.install_dir / READY_FILE), str(VALIDATION_NODE_PATH),
                        labels if ctx.config.node_name else {}, warnings)


def ready_document(ctx: Context, verified: VerifyResult) -> dict[str, Any]:
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
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def env_text(ctx: Context) -> str:
    """gpu-operator's driver-ready env file: the driver root is our install dir."""
    install_dir = str(ctx.config.install_dir)
    return (f"IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT={install_dir}\n"
            f"DRIVER_ROOT_CTR_PATH=/host{install_dir}\nNVIDIA_DEV_ROOT=/\n"
            f"DEV_ROOT_CTR_PATH=/host\n")


def node_labels(verified: VerifyResult) -> dict[str, str]:
    return {f"{LABEL_PREFIX}/driver-version": verified.driver_version,
            f"{LABEL_PREFIX}/cuda-version": verified.cuda_version,
            f"{LABEL_PREFIX}/status": "ready"}


def _publish(ctx: Context, verified: VerifyResult, labels: dict[str, str]) -> list[str]:
    """Label the node and post an Event when running in a cluster; failures are warnings."""
    node = ctx.config.node_name
    if not node:
        return []
    from installer import kube

    api = kube.api_server(ctx.config.kube_api, ctx.config.service_account_dir, os.environ)
    if api is None:
        return [f"node {node} not labelled: no API server URL or service-account token"]
    message = (f"NVIDIA driver {verified.driver_version} ready on {len(verified.gpus)} GPU(s) "
               f"(CUDA {verified.cuda_version}, kernel {verified.kernel_release})")
    warnings = []
    try:
        kube.patch_node_labels(api, node, labels)
    except kube.KubeError as exc:
        warnings.append(f"could not label the node: {exc}")
    try:
        kube.post_node_event(api, node, reason="DriverReady", message=message)
    except kube.KubeError as exc:
        warnings.append(f"could not post an Event: {exc}")
    for warning in warnings:
        ctx.log.warning("kubernetes API call failed", detail=warning)
    return warnings


def read_ready(ctx: Context) -> dict[str, Any] | None:
    """The current `.ready.json`, or None when the node is not ready."""
    text = ctx.host.read_text(ready_paths(ctx)[0])
    if text is None:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


class NotReadyError(VerificationError):
    """`wait-ready` gave up: no readiness for the loaded driver within the timeout."""


@dataclass(frozen=True)
class Readiness:
    """What `wait-ready` found."""

    ready: bool
    reason: str
    document: dict[str, Any] | None

    def to_json(self) -> str:
        return json.dumps({"ready": self.ready, "reason": self.reason,
                           "readiness": self.document}, indent=2)

    def to_text(self) -> str:
        return f"{'ready' if self.ready else 'not ready'}: {self.reason}"


def check_ready(ctx: Context) -> Readiness:
    """Ready means: `.ready.json` exists and names the driver version the kernel has loaded."""
    from installer import kmod

    document = read_ready(ctx)
    if document is None:
        return Readiness(False, f"no {READY_FILE} in {ctx.config.install_dir}", None)
    loaded = kmod.loaded_driver(ctx.host)
    if loaded is None:
        return Readiness(False, "no NVIDIA kernel module is loaded", document)
    if loaded.version != document.get("driver_version"):
        return Readiness(False, f"readiness is for driver {document.get('driver_version')} "
                         f"but the kernel has {loaded.version} loaded", document)
    return Readiness(True, f"driver {loaded.version} verified on "
                     f"{len(document.get('gpus') or [])} GPU(s)", document)


def wait_ready(ctx: Context, *, timeout: float, interval: float = 2.0) -> Readiness:
    """Poll until ready or the timeout passes (then NotReadyError, exit code 12)."""
    deadline = time.monotonic() + timeout
    while True:
        state = check_ready(ctx)
        if state.ready:
            return state
        if time.monotonic() + interval > deadline:
            raise NotReadyError(f"node not ready after {timeout:g}s: {state.reason}",
                                remedy="look at the installer pod's log on this node")
        time.sleep(interval)
