"""`gpu-node-installer preflight`: before a kernel or node image rolls out, does every
(kernel, arch, pool) get a driver? For CI before a node-image bump, and as a CronJob.

Reads no node: the settings it shows are the version rules, the mirrors, the downloads and
the API; the host mounts are never read (nor required).
"""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from installer.cli import logs
from installer.cli.commands import emit, output_option
from installer.cli.settings import NodeCommand, add_settings
from installer.config import SETTINGS, SETTINGS_BY_NAME, Config, load_config, raw, values

EPILOG = ("Exit 0: every target is served (and, with --strict, no lifecycle warning); 14: a "
          "kernel has no driver package, its driver cannot drive the GPU, or --strict and a "
          "branch is past or near its end of life; 2: a bad flag, --kernel or Node list; "
          "6 or 7: a mirror cannot be read or serves a broken index.json (named).")


def config_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The settings as options; hands the command a validated Config (no host roots: the
    command never reads the node, so their defaults are not required to exist)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        flags = {setting.name: kwargs.pop(setting.name) for setting in SETTINGS}
        rules = _version_map(flags.pop("driver_version_map"))
        flags.update(host_root="/", proc_root="/", sys_root="/", dev_root="/",
                     driver_version_map=None)
        obj = click.get_current_context().find_root().ensure_object(dict)
        environ = {k: v for k, v in os.environ.items() if k != "DRIVER_VERSION_MAP"}
        config = replace(load_config(flags, environ), driver_version_map=rules)
        if "config_view" in obj:  # tests: a Config that records which settings are read
            config = obj["config_view"](config)
        obj["config"] = config
        logs.configure(config.log_format, config.log_level)
        return fn(config, *args, **kwargs)

    return add_settings(wrapper)


def _version_map(flag: str | None) -> Path | None:
    """DRIVER_VERSION_MAP, checked as the table checks it but without the node name an
    install needs with it: preflight applies the map to every Node's labels it is given."""
    setting = SETTINGS_BY_NAME["driver_version_map"]
    text, source = raw.raw_value(setting, {setting.name: flag}, os.environ)
    if text is None:
        return None
    try:
        return Path(setting.parse(text))
    except values.Invalid as exc:
        raise raw.refusal(setting, source, text, exc) from None


def _today(value: str | None) -> datetime.date:
    from installer.errors import ConfigError

    if value is None:
        return datetime.datetime.now(datetime.UTC).date()
    try:
        return datetime.date.fromisoformat(value)
    except ValueError:
        raise ConfigError(f"--today {value[:40]!r} is not a date YYYY-MM-DD",
                          remedy="give --today like 2026-12-05, or leave it out") from None


@click.command(cls=NodeCommand, name="preflight", epilog=EPILOG)
@click.option("--kernel", "kernels", multiple=True, metavar="RELEASE[,ARCH]",
              help="a kernel release to check, with its arch (x86_64, aarch64; amd64/arm64 "
                   "too) [default arch: this machine's]; repeatable")
@click.option("--nodes", "nodes_file", metavar="FILE|-",
              help="`kubectl get nodes -o yaml` (or -o json): each node's kernel, arch, OS "
                   "image, pool and GPU labels, through DRIVER_VERSION_MAP's rules")
@click.option("--roll-out", "rollout", multiple=True, metavar="RELEASE[,ARCH]",
              help="check the Node list as if its nodes of that arch booted this kernel "
                   "(a new node image), pool by pool; repeatable, one per arch")
@click.option("--nodes-from-api", is_flag=True,
              help="read the Node list from the API server (the CronJob; needs nodes list)")
@click.option("--cos-build", "cos_builds", multiple=True,
              metavar="BUILD_ID[/BOARD][,ARCH]",
              help="a COS build: its GPU version files and artifacts (HEAD only); Nodes on "
                   "Container-Optimized OS are checked against it too; repeatable")
@click.option("--gpu", "gpus", multiple=True, metavar="MODEL",
              help="the GPU of the --kernel and --cos-build targets (B200, H100, nvidia-"
                   "tesla-t4, hopper): the branch support and flavour checks use it")
@click.option("--strict", is_flag=True,
              help="lifecycle warnings fail too (exit 14)")
@click.option("--today", metavar="YYYY-MM-DD",
              help="the date the end-of-life check uses [default: today, UTC]")
@click.option("--post-events", is_flag=True,
              help="post a Warning Event (DriverPackageMissing) on a node of each target "
                   "not served (needs the API: events create)")
@config_options
@output_option
def preflight(config: Config, kernels: tuple[str, ...], nodes_file: str | None,
              rollout: tuple[str, ...], nodes_from_api: bool, cos_builds: tuple[str, ...],
              gpus: tuple[str, ...], strict: bool, today: str | None, post_events: bool,
              output: str) -> None:
    """Does every kernel/node get a driver package? Exit 0 yes, 14 no (see below)."""
    from installer.compat.pods.workloads import read_input
    from installer.errors import ConfigError
    from installer.pipeline import fleet

    date = _today(today)
    if nodes_file and nodes_from_api:
        raise ConfigError("--nodes and --nodes-from-api both give the Node list",
                          remedy="give one of them")
    if rollout and not (nodes_file or nodes_from_api):
        raise ConfigError("--roll-out changes the kernel of the nodes in a Node list, and "
                          "none is given", remedy="give --nodes FILE|- (or use --kernel)")
    flags = fleet.Flags.parse(kernels, cos_builds, gpus, rollout)
    nodes = None
    if nodes_file:  # checked before the pipeline (and its imports) load
        nodes = fleet.parse_nodes(read_input(nodes_file, too_large=fleet.NODES_REMEDY),
                                  nodes_file)
    from installer.pipeline import preflight as check

    if nodes_from_api:
        nodes = check.nodes_from_api(config)
    plan = check.plan(config, flags, nodes, nodes_file or "from the API", date,
                      strict=strict)
    report = check.run(config, logs.get_logger(), plan)
    if post_events:
        check.post_events(config, report)
    emit(report, output)
    report.raise_if_failed()
