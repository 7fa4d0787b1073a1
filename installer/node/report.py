"""Human-readable reports for the debugging commands (`detect`, `status`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from installer.node.facts import NodeInfo


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def node_text(node: NodeInfo) -> str:
    """A few aligned lines an operator can read at 3 a.m."""
    os_line = node.os.pretty_name or node.os.id
    if node.os.cos_milestone:
        os_line += f" (COS milestone {node.os.cos_milestone}, build {node.os.cos_build})"
    driver = node.loaded_driver
    lines = [
        f"OS:              {os_line}",
        f"Kernel:          {node.kernel_release} ({node.kernel_arch})",
        f"Loaded driver:   {driver.version + ' ' + (driver.flavour or '') if driver else 'none'}",
        f"Secure boot:     {_yes_no(node.security.secure_boot)}; "
        f"sig_enforce: {_yes_no(node.security.module_sig_enforce)}; "
        f"lockdown: {node.security.lockdown or 'unknown'}",
        f"GPUs:            {len(node.gpus)}",
    ]
    for gpu in node.gpus:
        numa = "-" if gpu.numa_node is None else str(gpu.numa_node)
        lines.append(f"  {gpu.pci_address}  {gpu.device_id}  {gpu.name:<22} {gpu.architecture:<13}"
                     f" driver={gpu.driver:<9} numa={numa} flavours={'/'.join(gpu.flavours)}")
    if node.nvswitches:
        lines.append(f"NVSwitches:      {len(node.nvswitches)}")
    lines.append(f"Fabric:          {node.fabric.text}")
    if not node.gpus:
        lines.append("  no NVIDIA GPU on this node")
    lines.extend(f"Note: {note}" for note in node.notes)
    return "\n".join(lines)
