"""`gpu-node-installer prepare --kernel RELEASE`: the next kernel's package, into the cache.

The work lives in `installer.pipeline.prepare`; this prints its result (`-o json`: one
object, whatever the outcome) and exits with the failure's code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from installer.cli.commands import emit, lazy_node_options, output_option
from installer.cli.settings import NodeCommand

if TYPE_CHECKING:
    from installer.context import Context


@click.command(cls=NodeCommand)
@click.option("--kernel", "kernel", default=None, metavar="RELEASE",
              help="the kernel release to prepare, as `uname -r` prints it (one installed "
                   "under /lib/modules, not yet running)  [required]")
@lazy_node_options
@output_option
def prepare(node: Callable[[], Context], kernel: str | None, output: str) -> None:
    """Put the driver package for another kernel (the next boot's) into the host cache,
    verified, as `install` would resolve it; never loads, stages or marks anything ready.
    Exit 0 ready, 5 missing (the line names the `package build` command)."""
    from installer.pipeline.prepare import prepare as run_prepare

    result = run_prepare(node, kernel)
    if output == "json" or result.failure is None:  # text: a failure is stderr's line alone
        emit(result, output)
    if result.failure is not None:
        raise result.failure
