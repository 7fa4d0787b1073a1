"""The `agent` command: the DaemonSet's main container (and `--once`, `--probe`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from installer.cli.commands import emit, node_options, output_option
from installer.cli.settings import NodeCommand

if TYPE_CHECKING:  # types only: the command loads the node context when it runs
    from installer.context import Context


@click.command(cls=NodeCommand)
@click.option("--once", is_flag=True,
              help="one round: start what the node needs, wait (up to FABRIC_TIMEOUT on "
                   "fabric nodes) until ready, stop what it started; exit 0 ready, 12 not")
@click.option("--probe", is_flag=True,
              help="the readinessProbe: exit 0 when the running agent's view says ready and "
                   "is fresh, 12 otherwise (reads one small file, starts nothing)")
@node_options
@output_option
def agent(ctx: Context, output: str, once: bool, probe: bool) -> None:
    """Run the driver's daemons and keep readiness true only while the node can serve.

    Exit codes: 0 ready (--once, --probe) or stopped by SIGTERM; 2 bad setting (an
    NVFM_CONFIG_* included); 12 not ready; 14 the package lacks a daemon this node needs
    or its Fabric Manager differs from the driver."""
    if probe:
        from installer.agent.readiness import probe as probe_view
        from installer.installdir.readiness import NotReadyError

        found = probe_view(ctx.config, ctx.host)
        emit(found, output)
        if not found.ready:  # every 10 s while not ready: stderr only, never the container's
            error = NotReadyError(f"agent view: {found.reason}",  # termination message
                                  remedy="read the agent container's log on this node")
            click.echo(error.one_line(), err=True)
            raise click.exceptions.Exit(error.code)
        return
    from installer.agent.loop import run_agent

    emit(run_agent(ctx, os.environ, once=once, choose=_map_chooser(ctx)), output)


def _map_chooser(ctx: Context) -> Callable[[], Any] | None:
    """The install's own resolution of DRIVER_VERSION_MAP, for the agent to watch."""
    if ctx.config.driver_version_map is None:
        return None
    from installer.upgrade import versionmap

    return lambda: versionmap.choose(ctx.config)
