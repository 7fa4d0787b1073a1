"""The Node's `<prefix>/upgrade.skip=true`: this node keeps the driver it serves.

Read first, before anything is prepared, withdrawn, cordoned or evicted, whenever the loaded
driver differs from the package's, busy or idle and whatever the policy (as NVIDIA's skip
label: the node keeps serving and the rollout goes on). A skipped run exits 0 with the
loaded driver, its staged files and its readiness untouched; it posts an Event naming both
versions, leaves `.skipped.json` for `status` and, with a live-upgrade policy, sets the
state label to `upgrade-skipped` (under `refuse` nothing else writes that label, so nothing
would move it on). Without a Node name there is no label to read; without a reachable API
the label cannot be read: a warning says so and the run goes on as if it were absent.
Under `refuse`, a busy node then reports `upgrade-required` and waits (`required`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from installer.compat.nodelabels import UPGRADE_SKIP, UPGRADE_STATE
from installer.context import Context
from installer.installdir import skipped
from installer.node import kmod, kube
from installer.packages.manifest import Package
from installer.stages import load
from installer.upgrade import required

SKIPPED = "upgrade-skipped"


@dataclass(frozen=True)
class Skipped:
    """What was held back: the package's driver, and the one that keeps serving."""

    wanted: str
    serving: str

    def message(self) -> str:
        return (f"{UPGRADE_SKIP}=true: wanted {self.wanted}, serving {self.serving}; the "
                "loaded driver, its files and its readiness are kept")


def check(ctx: Context, package: Package) -> Skipped | None:
    """Skipped (labelled, told and recorded) when the label holds this upgrade back."""
    serving = kmod.loaded_driver(ctx.host)
    if serving is None or load.other_version(ctx.host, package) is None:
        return None  # nothing serves, or the package's driver already does: nothing to skip
    node = ctx.config.node_name
    if not node:
        return None  # a run by hand: no Node, no label
    api = kube.connect(ctx.config, os.environ)
    if api is None:
        ctx.log.warning(f"{UPGRADE_SKIP} not read: no Kubernetes API (no API server URL or "
                        "service-account token); the driver is replaced as without it")
        return None
    labels = _node_labels(ctx, api, node)
    if labels is None:
        return None
    if labels.get(UPGRADE_SKIP) != "true":
        required.check(ctx, api, node, package, labels)  # refuse: report and wait
        return None
    manifest = package.manifest
    result = Skipped(_name(manifest.driver_version, manifest.flavour, serving.version),
                     _name(serving.version, serving.flavour, manifest.driver_version))
    _tell(ctx, api, node, result)
    skipped.record(ctx.config, ctx.host.roots, wanted=result.wanted, serving=result.serving,
                   label=UPGRADE_SKIP)
    ctx.log.warning("driver upgrade skipped", label=UPGRADE_SKIP, wanted=result.wanted,
                    serving=result.serving)
    return result


def _node_labels(ctx: Context, api: kube.ApiServer, node: str) -> dict[str, object] | None:
    """The Node's labels, or None (with a warning) when they cannot be read."""
    try:
        labels = (kube.get_node(api, node).get("metadata") or {}).get("labels")
    except kube.KubeError as exc:
        ctx.log.warning(f"{UPGRADE_SKIP} not read: the driver is replaced as without it",
                        detail=str(exc))
        return None
    return labels if isinstance(labels, dict) else {}


def _tell(ctx: Context, api: kube.ApiServer, node: str, result: Skipped) -> None:
    """The state label (live-upgrade policies) and an Event; failures are warnings only:
    the node keeps serving either way."""
    try:
        if ctx.config.upgrade_policy != "refuse":
            kube.patch_node(api, node, {"metadata": {"labels": {UPGRADE_STATE: SKIPPED}}})
        kube.post_node_event(api, node, reason="DriverUpgradeSkipped",
                             message=result.message())
    except kube.KubeError as exc:
        ctx.log.warning("upgrade skip not told to the cluster", detail=str(exc))


def _name(version: str, flavour: str | None, other: str | None) -> str:
    """A version, with its flavour when that is all that tells the two apart."""
    return f"{version} ({flavour})" if version == other and flavour else version
