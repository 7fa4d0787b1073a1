"""The `gpu-node-installer` command line: parse, build Config and Host, call a stage, render.

Commands hold no logic. Every node-facing command accepts the same settings (see
`installer.config.SETTINGS`; its help shows those it reads: `installer.cli.settings`);
failures are `InstallerError`s, which `installer.cli.failures` turns into one line, the
termination log and the class's exit code.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import click

from installer import __version__
from installer.cli import logs
from installer.cli.failures import InstallerGroup
from installer.cli.settings import NodeCommand, add_settings
from installer.config import SETTINGS, load_config
from installer.errors import error_table

if TYPE_CHECKING:  # start-up is a feature: `--help` and check-pod never load these
    from installer.context import Context
    from installer.node.host import Host, Roots
    from installer.pipeline import commands as run

    HostFactory = Callable[[Roots], Host]

F = TypeVar("F", bound=Callable[..., Any])


def lazy_module(name: str) -> ModuleType:
    """The module `name`, loaded on its first attribute access rather than now: the
    pipeline (and the stages it imports) costs only the commands that call it."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


if not TYPE_CHECKING:
    run = lazy_module("installer.pipeline.commands")


def _epilog() -> str:
    """The exit-code table, one code a line: `\b` keeps click from rewrapping it."""
    rows = [(0, "success"), *((cls.code, cls.summary) for cls in error_table())]
    lines = []
    for code, summary in rows:
        lines.extend(textwrap.wrap(summary, 70, initial_indent=f"  {code:>3}  ",
                                   subsequent_indent=" " * 7))
    return "Exit codes:\n\n\b\n" + "\n".join(lines)


def node_options(fn: F) -> F:
    """Add the settings as options; hand the command a ready `Context` instead."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        flags = {setting.name: kwargs.pop(setting.name) for setting in SETTINGS}
        return fn(make_context(flags), *args, **kwargs)

    return add_settings(wrapper)  # type: ignore[return-value]


def make_context(flags: dict[str, Any]) -> Context:
    """Validate settings, configure logs, build the host seam (tests may inject a factory)."""
    click_ctx = click.get_current_context()
    obj = click_ctx.find_root().ensure_object(dict)
    obj["termination_log_flag"] = flags.get("termination_log") is not None
    config = load_config(flags, os.environ)
    if "config_view" in obj:  # tests: a Config that records which settings are read
        config = obj["config_view"](config)
    obj["config"] = config
    logs.configure(config.log_format, config.log_level)
    from installer.context import Context
    from installer.node.host import RealHost, Roots

    factory: HostFactory = obj.get("host_factory", RealHost)
    return Context(config=config, host=factory(Roots.from_config(config)),
                   log=logs.get_logger())


def remember_output(ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """Note the chosen output where a failure's report finds it."""
    ctx.find_root().ensure_object(dict)["output"] = value
    return value


def output_option(fn: F) -> F:
    """`-o/--output text|json` for commands that report something (a failure too)."""
    return click.option("-o", "--output", "output", type=click.Choice(["text", "json"]),
                        default="text", show_default=True, callback=remember_output,
                        help="human-readable text or JSON (a failure too: a JSON object "
                             "on stdout)")(fn)


def emit(result: Any, output: str) -> None:
    """Print a result as JSON or as its human text (results offer to_json/to_text); a
    failure after it (check-pod's failed rules) is then the exit code and stderr's line."""
    click.echo(result.to_json() if output == "json" else result.to_text())
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.find_root().ensure_object(dict)["emitted"] = True


@click.group(cls=InstallerGroup, epilog=_epilog(),
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpu-node-installer")
def cli() -> None:
    """Install a matching NVIDIA kernel module and user-mode driver on this node."""


@cli.command(cls=NodeCommand)
@node_options
@output_option
def detect(ctx: Context, output: str) -> None:
    """Report the node: OS, kernel, NVIDIA PCI devices, loaded driver, security."""
    emit(run.detect(ctx), output)


def lazy_node_options(fn: F) -> F:
    """Like `node_options`, but hands the command a zero-argument factory of the `Context`:
    commands that may not need the node (`compat --driver V`) then run where no host
    mounts exist, and the settings are validated only when the node is read."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        flags = {setting.name: kwargs.pop(setting.name) for setting in SETTINGS}
        return fn(functools.partial(make_context, flags), *args, **kwargs)

    return add_settings(wrapper)  # type: ignore[return-value]


@cli.command(cls=NodeCommand)
@click.option("--cuda", "cuda", required=True, metavar="X.Y[.Z]",
              help="CUDA toolkit version the application was built with, e.g. 12.4")
@click.option("--driver", "driver", default=None, metavar="VERSION",
              help="driver version to check, e.g. 535.261.03 [default: the loaded driver]")
@lazy_node_options
@output_option
def compat(node: Callable[[], Context], cuda: str, driver: str | None, output: str) -> None:
    """Does a driver run a CUDA toolkit? Exit 0 yes, 14 no, 2 for a malformed version."""
    from installer.compat.toolkit import raise_if_incompatible

    verdict = run.compat(cuda, driver, node)
    emit(verdict, output)
    raise_if_incompatible(verdict)


@cli.command(cls=NodeCommand)
@node_options
@output_option
def load(ctx: Context, output: str) -> None:
    """Fetch the driver package, load its kernel modules, create the device nodes."""
    emit(run.load(ctx), output)


@cli.command(cls=NodeCommand)
@node_options
@output_option
def unload(ctx: Context, output: str) -> None:
    """Unload the NVIDIA kernel modules, refusing (exit 10) while anything uses them."""
    emit(run.unload(ctx), output)


@cli.command(cls=NodeCommand)
@node_options
@output_option
def fetch(ctx: Context, output: str) -> None:
    """Resolve the driver for this node and get its package (preloaded, cache, mirrors)."""
    emit(run.fetch(ctx), output)


@cli.command(cls=NodeCommand)
@node_options
@output_option
def versions(ctx: Context, output: str) -> None:
    """List what each package source offers for this node and what would be chosen
    (exit 5 when nothing would be: the report is printed all the same)."""
    found = run.versions(ctx)
    emit(found, output)
    if found.versions.resolved is None:
        from installer.errors import PackageNotFoundError

        error = PackageNotFoundError(f"nothing for this node: {found.versions.problem}")
        click.echo(error.one_line(), err=True)
        raise click.exceptions.Exit(error.code)


@cli.command(cls=NodeCommand)
@click.option("--rollback", is_flag=True,
              help="switch back to the previously staged version instead of staging")
@node_options
@output_option
def stage(ctx: Context, output: str, rollback: bool) -> None:
    """Place the driver's libraries and binaries in the install dir; switch atomically."""
    emit(run.rollback(ctx) if rollback else run.stage(ctx), output)


@cli.command(cls=NodeCommand)
@click.option("--cuda-smoke", is_flag=True,
              help="also run a vector add on every GPU through the CUDA driver API")
@click.option("--lib-dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None, help="check the libnvidia-ml.so.1/libcuda.so.1 in this directory "
              "(e.g. a GPU VM's own driver) instead of the install dir")
@click.option("--expect-gpus", type=click.IntRange(min=0), default=None,
              help="GPUs that must be seen [default: the NVIDIA GPUs on the PCI bus]")
@node_options
@output_option
def verify(ctx: Context, output: str, cuda_smoke: bool, lib_dir: Path | None,
           expect_gpus: int | None) -> None:
    """Check the staged driver through NVML and CUDA against the node's GPUs."""
    emit(run.verify(ctx, cuda_smoke=cuda_smoke, lib_dir=lib_dir, gpu_count=expect_gpus),
         output)


@cli.command(cls=NodeCommand, name="signal")
@node_options
@output_option
def signal_command(ctx: Context, output: str) -> None:
    """Verify, then write readiness (and label the node when in a cluster)."""
    emit(run.signal(ctx), output)


@cli.command(cls=NodeCommand, name="cdi")
@node_options
@click.option("-o", "--output", "output", type=click.Choice(["json", "yaml"]), default="json",
              show_default=True, callback=remember_output,
              help="JSON (as written) or YAML (as nvidia-ctk prints)")
def cdi_command(ctx: Context, output: str) -> None:
    """Print the CDI spec for this node's staged driver (what `signal` writes)."""
    click.echo(run.cdi_spec(ctx).render(output))


@cli.command(cls=NodeCommand)
@click.option("--dry-run", is_flag=True,
              help="show what would change on each GPU and change nothing")
@node_options
@output_option
def partition(ctx: Context, output: str, dry_run: bool) -> None:
    """Split the GPUs into MIG instances as configured (gpu_config.json, MIG_CONFIG_FILE,
    MIG_PROFILE); what `install` runs after verify."""
    from installer.pipeline import partition as stage

    if dry_run:
        emit(stage.command(ctx, dry_run=True), output)
        return
    with run.locked(ctx):
        emit(stage.command(ctx, dry_run=False), output)


@cli.command(cls=NodeCommand)
@node_options
@output_option
def status(ctx: Context, output: str) -> None:
    """Report the node, cache, loaded module, staged versions, readiness, last timings."""
    emit(run.status(ctx), output)


@cli.command(cls=NodeCommand, name="wait-ready")
@click.option("--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="seconds to wait before failing (exit 12)")
@click.option("--interval", type=click.FloatRange(min=0.05), default=2.0, show_default=True,
              help="seconds between checks")
@node_options
@output_option
def wait_ready(ctx: Context, output: str, timeout: float, interval: float) -> None:
    """Block until the node's driver is verified and ready (for init containers)."""
    emit(run.wait_ready(ctx, timeout=timeout, interval=interval), output)


@cli.command(cls=NodeCommand)
@click.option("--paranoid", is_flag=True,
              help="on the fast path, rehash every cached and staged file instead of sizes")
@node_options
@output_option
def install(ctx: Context, output: str, paranoid: bool) -> None:
    """Detect, fetch, load, stage, verify and signal: what the DaemonSet runs."""
    from installer.pipeline.install import install as install_pipeline

    emit(install_pipeline(ctx, paranoid=paranoid), output)


@cli.command(cls=NodeCommand)
@click.option("--keep-cache", is_flag=True, help="keep downloaded packages for a reinstall")
@node_options
@output_option
def uninstall(ctx: Context, output: str, keep_cache: bool) -> None:
    """Unload the driver and remove what `install` put on the node (refuses while in use)."""
    emit(run.uninstall(ctx, keep_cache=keep_cache), output)


def main() -> None:
    """Console-script entry point."""
    cli.main(prog_name="gpu-node-installer")


if __name__ == "__main__":  # pragma: no cover
    main()
