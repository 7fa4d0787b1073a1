"""How a command's failure reaches an operator and a script: one printable line on stderr,
the termination log (only where the kubelet made it, or where asked), the class's exit code,
and with `-o json` the failure as one JSON object on stdout. Here and nowhere else."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

import click

from installer.config import SETTINGS_BY_NAME, Config
from installer.errors import ConfigError, InstallerError, disk_full, printable
from installer.node import interrupts


class InstallerGroup(click.Group):
    """Turns InstallerError (and unexpected exceptions) into one line and an exit code;
    SIGTERM and SIGINT end the command as such an error (`installer.node.interrupts`)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["json_asked"] = asks_json(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        with interrupts.handled():
            try:
                return super().invoke(ctx)
            except click.UsageError as exc:  # click's own refusal: its usage text on stderr
                if ctx.meta.get("json_asked"):
                    refused = ConfigError(exc.format_message(),
                                          remedy="see the command's --help")
                    click.echo(json.dumps(failure_object(refused, refused.one_line())))
                raise
            except (click.exceptions.Exit, click.ClickException, click.Abort):
                raise
            except InstallerError as exc:
                interrupts.disarm()
                _report(ctx, exc)
                raise click.exceptions.Exit(exc.code) from exc
            except interrupts.Signalled as sig:  # outside any stage (e.g. the lock wait)
                interrupts.disarm()
                command = ctx.invoked_subcommand or "run"
                error = sig.error(command, f"during {command}, outside its stages")
                _report(ctx, error)
                raise click.exceptions.Exit(error.code) from None
            except Exception as exc:
                interrupts.disarm()
                full = disk_full(exc, cleaned=False)  # a full disk no write site named: exit 11
                if full is not None:
                    _report(ctx, full)
                    raise click.exceptions.Exit(full.code) from exc
                if _debug_enabled(ctx):
                    traceback.print_exc()
                _report(ctx, InstallerError(f"{type(exc).__name__}: {exc}"))
                raise click.exceptions.Exit(1) from exc


def _debug_enabled(ctx: click.Context) -> bool:
    config = _config_of(ctx)
    if config is not None:
        return config.debug
    return os.environ.get("DEBUG", "").lower() in ("1", "true", "yes", "on")


def _config_of(ctx: click.Context) -> Config | None:
    obj = ctx.find_object(dict)
    return None if obj is None else obj.get("config")


# Commands run by hand to look at a node, a workload or a fleet, and `prepare` (the agent
# runs it beside its own work): their failure is no pod's last word, so it never goes to a
# termination log (nor creates one in a laptop's real /dev).
LOOK_ONLY = frozenset({"check-pod", "compat", "detect", "preflight", "prepare", "status",
                       "versions"})


def _report(ctx: click.Context, error: InstallerError) -> None:
    """Print the failure line, with `--output json` also the failure as a JSON object on
    stdout, and copy the line to the termination log (`_termination_log`).

    The line may quote a hostile document: control characters and lone surrogates are
    escaped, so it stays one printable line and no encoding step can fail on it.
    """
    line = printable(error.one_line())
    click.echo(line, err=True)
    obj = ctx.find_object(dict) or {}
    if obj.get("output") == "json" and not obj.get("emitted"):  # one JSON document only
        click.echo(json.dumps(failure_object(error, line)))
    if ctx.invoked_subcommand in LOOK_ONLY:
        return
    target, explicit = _termination_log(ctx)
    if target is None:
        return
    # the default path is written only where the kubelet made it: never created here
    flags = os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | (
        os.O_CREAT if explicit else os.O_NOFOLLOW)
    try:
        with os.fdopen(os.open(target, flags, 0o644), "w", encoding="utf-8",
                       errors="backslashreplace") as handle:
            handle.write(line + "\n")
    except (OSError, ValueError):
        pass  # absent, a directory, read-only or odd: the line is on stderr all the same


def _termination_log(ctx: click.Context) -> tuple[Path | None, bool]:
    """Where the failure line goes, and whether the operator set that path explicitly
    (--termination-log or $TERMINATION_LOG); before the config loaded, $TERMINATION_LOG only
    once it passes its own check."""
    config = _config_of(ctx)
    value = os.environ.get("TERMINATION_LOG", "")
    if config is not None:
        obj = ctx.find_object(dict) or {}
        return config.termination_log, bool(obj.get("termination_log_flag") or value)
    try:
        return Path(SETTINGS_BY_NAME["termination_log"].parse(
            value or SETTINGS_BY_NAME["termination_log"].default or "")), bool(value)
    except ValueError:
        return None, False


def asks_json(words: list[str]) -> bool:
    """Do the command's words ask for `-o/--output json` (read before click parses them, so a
    usage error is a JSON object too)?"""
    pairs = zip(words, [*words[1:], ""], strict=True)
    return any(w in ("-ojson", "--output=json") or (w in ("-o", "--output") and n == "json")
               for w, n in pairs)


def failure_object(error: InstallerError, line: str) -> dict[str, Any]:
    """A failure for scripts (`--output json`): the line, the exit code and its parts."""
    return {"error": line, "exit_code": error.code, "slug": error.slug,
            "stage": error.stage, "message": printable(error.message),
            "fix": printable(error.remedy)}
