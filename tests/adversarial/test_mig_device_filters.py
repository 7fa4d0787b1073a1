"""MIG configs whose `device-filter` cannot apply: PCI ids written unquoted (YAML reads
`0x20B010DE` as a number: the line shows it in hex and says to quote it) or malformed, and
the subsystem-id filters (`0xDDDDVVVV:0xSSSSVVVV`) that match a board. The node and checks
are `adversarial.migkit`'s: each refusal is exit 2 with one line, before any GPU is touched.
"""

from __future__ import annotations

import json

import pytest

from adversarial import migkit
from adversarial.harness import Arena, assert_ok
from adversarial.migkit import (
    _addresses,
    _config,
    _partition,
    _refused,
)

# The fixtures (the node installed once per module, copied into each case's arena).
installed = migkit.installed
node = migkit.node

# ------------------------------------------------------------------ device-filter

FILTERS = {
    "one id unquoted": ("0x20B010DE", 'device-filter holds the number 548409566 (0x20B010DE '
                        'unquoted', 'fix: quote each PCI id: device-filter: "0x20B010DE"'),
    "an unquoted id in a list": ('["0x20B210DE", 0x20B010DE]',
                                 "holds the number 548409566 (0x20B010DE unquoted",
                                 'quote each PCI id: device-filter: "0x20B010DE"'),
    "a short id": ('"0x20B0"', "device-filter holds '0x20B0', not a PCI id",
                   'e.g. "0x20B010DE"'),
    "a mapping": ("{device: 0x20B0}", "device-filter is {'device': 8368}", "0x<device><vendor>"),
    "an empty list": ("[]", "device-filter is []", "0x<device><vendor>"),
}

@pytest.mark.parametrize("case", FILTERS)
def test_an_unquoted_or_malformed_device_filter_is_refused(node: Arena, case: str) -> None:
    value, said, fix = FILTERS[case]
    _refused(node, _config(f"    - devices: all\n      device-filter: {value}\n"
                           "      mig-enabled: false\n"), said, fix)



SUBSYSTEM = {  # filter -> the GPUs it reaches (GPUs 0-3 are board 0x145F10DE, 4-7 0x147E10DE)
    '"0x20B010DE:0x147E10DE"': [4, 5, 6, 7],
    '"0x20b010de:0x145f10de"': [0, 1, 2, 3],
    '"0x20B010DE"': list(range(8)),
    '["0x20B010DE:0x000010DE", "0x20B210DE:0x147E10DE"]': [],
}


@pytest.mark.parametrize("value", SUBSYSTEM)
def test_subsystem_id_device_filters(node: Arena, value: str) -> None:
    """`0xDDDDVVVV:0xSSSSVVVV` matches the board too; a plain id any board of the GPU."""
    for index, address in enumerate(_addresses()):
        base = node.root / "sys/bus/pci/devices" / address
        (base / "subsystem_device").write_text("0x147e\n" if index >= 4 else "0x145f\n")
        (base / "subsystem_vendor").write_text("0x10de\n")
    done = _partition(node, _config(f"    - devices: all\n      device-filter: {value}\n"
                                    '      mig-enabled: true\n'
                                    '      mig-devices: {"1g.5gb": 7}\n'), "case", "--dry-run")
    assert_ok(done)
    assert json.loads(done.stdout)["changed"] == SUBSYSTEM[value]


def test_a_malformed_subsystem_id_is_refused(node: Arena) -> None:
    _refused(node, _config('    - devices: all\n      device-filter: "0x20B010DE:0x147E"\n'
                           "      mig-enabled: false\n"),
             "device-filter holds '0x20B010DE:0x147E', not a PCI id", 'e.g. "0x20B010DE"')
