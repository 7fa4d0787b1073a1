"""UPGRADE_POLICY=refuse meets a driver change on a busy node: it reports and waits.

The installer frees no GPUs under `refuse`. When another driver than the wanted one serves
and is in use (a new version in the settings, or the per-pool map's entry changed), the node
says so where a rollout is watched: the `<prefix>/upgrade-state` label becomes
`upgrade-required` and a Warning Event names both versions, the holders and what to do; the
run then ends with exit 10 (module-in-use) saying the node waits, having changed nothing on
the host. Once the GPUs are free, the next run installs and takes the label away (under
`refuse` nothing else would move it on). Failing to tell the cluster is only a warning.
"""

from __future__ import annotations

from installer.compat.nodelabels import UPGRADE_STATE
from installer.context import Context
from installer.errors import ModuleInUseError
from installer.node import kube
from installer.packages.manifest import Package
from installer.stages import load

REQUIRED = "upgrade-required"
REMEDY = ("free the node's GPUs (docs/upgrading.md, 'Upgrade node by node': cordon, stop "
          "the GPU pods and the device-plugin pod) and rerun, or set UPGRADE_POLICY=evict "
          "to let the installer do it; the next run installs it")


def check(ctx: Context, api: kube.ApiServer, node: str, package: Package,
          labels: dict[str, object]) -> None:
    """Under `refuse`: ModuleInUseError (label and Event told) while the other driver is in
    use; the label taken away once it is free."""
    other = load.other_version(ctx.host, package)
    if ctx.config.upgrade_policy != "refuse" or other is None:
        return
    try:
        load.check_free(ctx.host, *other)
    except ModuleInUseError as exc:
        wanted = package.manifest.driver_version
        message = (f"{exc.message}; driver {wanted} is wanted and UPGRADE_POLICY=refuse: the "
                   f"node is labelled {UPGRADE_STATE}={REQUIRED} and waits")
        _tell(ctx, api, node, REQUIRED, ("DriverUpgradeRequired", message))
        raise ModuleInUseError(message, remedy=REMEDY) from exc
    if labels.get(UPGRADE_STATE) == REQUIRED:  # freed since: the install goes on
        _tell(ctx, api, node, None, ("DriverUpgradeProceeding", "the GPUs are free: "
                                     f"installing {package.manifest.driver_version}"))


def _tell(ctx: Context, api: kube.ApiServer, node: str, state: str | None,
          event: tuple[str, str]) -> None:
    try:
        kube.patch_node(api, node, {"metadata": {"labels": {UPGRADE_STATE: state}}})
        kube.post_node_event(api, node, reason=event[0], message=event[1],
                             event_type="Warning" if state else "Normal")
    except kube.KubeError as exc:
        ctx.log.warning("upgrade-required not told to the cluster", detail=str(exc))
