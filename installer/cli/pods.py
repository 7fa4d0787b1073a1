"""`gpu-node-installer check-pod FILE|-`: will this workload run on a GPU node, rule by rule?

Needs no root and no node: only `--here` reads this node (its labels and loaded driver),
through the same settings as every node-facing command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from installer.cli.commands import emit, lazy_node_options, output_option
from installer.cli.settings import NodeCommand

if TYPE_CHECKING:  # types only: the command loads the node context when it runs
    from installer.context import Context


@click.command(cls=NodeCommand, name="check-pod")
@click.argument("source", metavar="FILE|-")
@click.option("--resource", "resources", multiple=True, metavar="NAME",
              help="another extended resource to check like nvidia.com/gpu (NVIDIA's, MIG, "
                   "AMD's and Intel's GPU resources and DRA claims are known); repeatable")
@click.option("--cuda", default=None, metavar="X.Y[.Z]",
              help="CUDA toolkit of every GPU container [default: each container's "
                   "NVIDIA_REQUIRE_CUDA or CUDA_VERSION env, else its image tag]")
@click.option("--driver", default=None, metavar="VERSION",
              help="the node's driver version [default with --here: the loaded driver]")
@click.option("--node-labels", "node_labels", default=None, metavar="FILE",
              help="the node: `kubectl get node NAME -o yaml` (labels, taints, allocatable), "
                   "`kubectl get nodes -o yaml` (which nodes fit), or a mapping of labels")
@click.option("--platform", default="auto", show_default=True,
              type=click.Choice(["auto", "gke", "aks", "eks", "generic"]),
              help="the cluster's platform, for its GPU taint and admission "
                   "[auto: from the node's labels, else the workloads' selectors]")
@click.option("--strict", is_flag=True, help="warnings fail too (exit 14)")
@click.option("--here", is_flag=True,
              help="check against this node: the labels signal wrote (or the GPUs detect "
                   "finds) and the loaded driver")
@lazy_node_options
@output_option
def check_pod(node: Callable[[], Context], source: str, resources: tuple[str, ...],
              cuda: str | None, driver: str | None, node_labels: str | None, platform: str,
              strict: bool, here: bool, output: str) -> None:
    """Will this Pod/workload get a GPU and run here? Exit 0 yes, 14 a rule fails, 2 bad file."""
    from installer.compat import pods
    from installer.compat.pods.workloads import NODES_REMEDY, read_input
    from installer.errors import ConfigError

    if here and node_labels:
        raise ConfigError("--here and --node-labels both describe the node",
                          remedy="give one of them")
    documents = pods.parse(read_input(source), source)
    views: tuple[pods.NodeView, ...] = (pods.NodeView(driver=driver),)
    if node_labels is not None:
        data = read_input(node_labels, too_large=NODES_REMEDY)
        views = pods.node_views_from_document(data, str(Path(node_labels)), driver)
    elif here:
        from installer.pipeline.podnode import here as this_node

        views = (this_node(node(), driver),)
    report = pods.check(documents, source, node=views, cuda=cuda, resources=resources,
                        platform=platform, strict=strict)
    emit(report, output)
    report.raise_if_failed()
