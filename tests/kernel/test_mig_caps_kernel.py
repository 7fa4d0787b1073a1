"""MIG on a real kernel: the MIG capability device nodes, made on the guest's devtmpfs
with the major of `nvidia-caps` and the minors of `mig-minors`, as GKE's device plugin
reads them (`/dev/nvidia-caps/nvidia-cap<N>`); a rerun keeps them."""

from __future__ import annotations

import sys

from .conftest import GuestRunner

SCRIPT = f'"{sys.executable}" tests/kernel/mig_caps_guest.py "$GNI_OUT"\n'


def test_cap_nodes_have_the_tables_numbers(run_guest: GuestRunner) -> None:
    result = run_guest(SCRIPT)
    assert result.rc == 0, result.describe()
    data = result.json("results.json")
    nodes, expected = data["nodes"], data["expected"]
    for gi in range(7, 14):
        for key in (f"gpu0/gi{gi}/access", f"gpu0/gi{gi}/ci0/access"):
            name = f"nvidia-caps/nvidia-cap{expected[key]}"
            assert nodes[name] == {"char": True, "major": 237, "minor": expected[key],
                                   "mode": 0o444, "link": f"../{name}"}, key
    assert nodes["nvidia-caps/nvidia-cap1"]["mode"] == 0o400  # MIG config: root only
    assert len(nodes) == 2 + 7 * 2
    assert sorted(data["created"]) == sorted(nodes)
    assert sorted(data["kept_on_rerun"]) == sorted(nodes)
    assert not data["changed_on_rerun"]
    assert set(data["record"]["nodes"]) == set(nodes)  # recorded as ours, this boot
