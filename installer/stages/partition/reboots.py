"""The reboot guards: `.mig-reboot.json` in the install dir, the node reboots the partition
stage asked for a MIG mode change, counted per boot ID.

As NVIDIA's mig-manager (mig-parted pkg/mig/reconfigure/reconfigure.go @ bd7160f4): a mode
change still pending after the reboot made for it is `failed` and never reboots again
(`checkMigModeChangeRequired`: state `rebooting` and the mode not applied), and the node is
not rebooted unless the `rebooting` state was recorded first (`Run`: "Exiting so as not to
reboot multiple times unexpectedly"). mig-manager keeps that state only in the Node label,
which this stage rewrites to `pending` at the start of every run, so the guard keeps its
own record on the node's disk, keyed by the kernel's boot ID: a record from another boot
means the node rebooted since. Within one boot at most MIG_REBOOT_LIMIT signals are sent
(a reboot asked for and not happening is not asked for forever). A successful layout, or
MIG no longer configured, forgets the record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from installer.context import Context
from installer.installdir.layout import MIG_REBOOT_RECORD
from installer.node.documents import DocumentError, read_json_file
from installer.node.kmsg import boot_id

RECORD = MIG_REBOOT_RECORD
_MAX_BYTES = 16 * 1024
_UNREADABLE = ""  # never a boot ID: check() refuses on an empty one first


class Refusal(Exception):
    """Why this run must not reboot the node (the message names it), and the fix."""

    def __init__(self, message: str, remedy: str) -> None:
        super().__init__(message)
        self.message, self.remedy = message, remedy


def path(ctx: Context) -> Path:
    return ctx.install_root / RECORD


def shown(ctx: Context) -> str:
    """The record's path on the node, for messages."""
    return f"{str(ctx.config.install_dir).rstrip('/')}/{RECORD}"


def _read(ctx: Context) -> dict[str, int]:
    """Reboots asked per boot ID; an unreadable record reads as `{_UNREADABLE: 1}`, which
    `check` refuses (what cannot be counted never allows a reboot)."""
    try:
        data = read_json_file(path(ctx), limit=_MAX_BYTES)
    except DocumentError:
        return {_UNREADABLE: 1}
    if data is None:
        return {}
    boots = data.get("boots") if isinstance(data, dict) else None
    if not isinstance(boots, dict) or not all(
            isinstance(k, str) and isinstance(v, int) for k, v in boots.items()):
        return {_UNREADABLE: 1}
    return boots


def check(ctx: Context, pending: Sequence[int]) -> None:
    """Refuse a reboot after one that left the mode pending, or past this boot's limit."""
    named = ", ".join(map(str, pending))
    boots = _read(ctx)
    current = boot_id(ctx.host)
    again = (f"find why the mode does not apply (nvidia-smi -q: Pending MIG mode), then "
             f"delete {shown(ctx)} to allow one more reboot, or reboot the node yourself")
    if not current:
        raise Refusal(f"the MIG mode of GPU(s) {named} needs a reboot, but the boot ID "
                      "(/proc/sys/kernel/random/boot_id) is unreadable, so a reboot could "
                      "not be told from a reboot loop; no reboot",
                      "mount the node's /proc so the boot ID is readable, or reboot the "
                      "node yourself")
    if _UNREADABLE in boots:
        raise Refusal(f"the MIG mode of GPU(s) {named} needs a reboot, but the reboot record "
                      f"{shown(ctx)} is unreadable, so earlier reboots cannot be counted; "
                      "no reboot", again)
    earlier = sorted(b for b in boots if b != current)
    if earlier:
        raise Refusal(f"the MIG mode of GPU(s) {named} is still pending after the node "
                      f"rebooted for it (asked in boot {earlier[-1]}); no further reboot",
                      again)
    asked = boots.get(current, 0)
    if asked >= ctx.config.mig_reboot_limit:
        raise Refusal(f"the node reboot for the MIG mode of GPU(s) {named} was asked "
                      f"{asked} time(s) in this boot and has not happened; "
                      f"MIG_REBOOT_LIMIT={ctx.config.mig_reboot_limit}, no further signal",
                      "check that PID 1 (systemd) reboots on SIGRTMIN+5 and that the pod "
                      f"runs with hostPID, or reboot the node yourself; or {again}")


def record(ctx: Context, pending: Sequence[int]) -> None:
    """Count one more reboot in this boot, before the signal (OSError: not recorded)."""
    from installer.node.host import write_atomic

    boots = {k: v for k, v in _read(ctx).items() if k != _UNREADABLE}
    current = boot_id(ctx.host)
    boots[current] = boots.get(current, 0) + 1
    body = json.dumps({"boots": boots, "gpus": sorted(pending)}, indent=1) + "\n"
    write_atomic(path(ctx), body.encode())


def forget(ctx: Context) -> None:
    path(ctx).unlink(missing_ok=True)
