"""The command line: click commands (`commands`), the log set-up (`logs`) and the reference
tables generated from the code (`docs`, rendered into docs/reference.md). Commands parse,
call one pipeline function and render; the sequencing lives in `installer.pipeline`."""

from installer.cli.agent import agent
from installer.cli.commands import cli, main
from installer.cli.package import package
from installer.cli.pods import check_pod
from installer.cli.preflight import preflight
from installer.cli.prepare import prepare

cli.add_command(agent)
cli.add_command(package)
cli.add_command(check_pod)
cli.add_command(preflight)
cli.add_command(prepare)

__all__ = ["cli", "main"]
