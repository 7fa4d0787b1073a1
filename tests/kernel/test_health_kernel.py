"""Issue 24 on a real kernel: Xid lines in the guest's real /dev/kmsg become a node condition
and Events on the strict fake API.

One guest boot: the script writes lines in the NVIDIA driver's format into the kernel's log
as root (`echo '<3>NVRM: Xid (PCI:...): 48, ...' > /dev/kmsg`), then
tests/kernel/health_guest.py runs the agent's health round (`installer.agent.health`)
over the real device: the backlog, a live Xid written while the round waits, and an agent
restarted in the same boot. The tests assert on what the guest recorded.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from installer.agent import health

from . import guest
from .assets import Kernel
from .conftest import REPO

pytestmark = pytest.mark.timeout(900)
GPU = "0000:00:05"
BACKLOG = [
    "<3>NVRM: Xid (PCI:0000:00:05): 48, pid=1234, name=train.py, An uncorrectable double "
    "bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
    "subpartition 0.",
    "<4>NVRM: Xid (PCI:0000:00:06): 13, pid=1234, name=train.py, Graphics Exception: ESR "
    "0x514730=0x201000e",
    "<6>NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.261.03",
]


@pytest.fixture(scope="module")
def guest_run(kernel: Kernel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("health-kernel")
    lines = "".join(f"echo '{line}' > /dev/kmsg\n" for line in BACKLOG)
    script = (f"set -e\nip link set lo up\n{lines}"
              f'"{sys.executable}" tests/kernel/health_guest.py "$GNI_OUT/results.json"\n')
    result = guest.run_in_guest(script, kernel=kernel, timeout=600, cwd=REPO,
                                env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}, out_dir=out)
    assert result.rc == 0, result.describe()
    data: dict[str, Any] = result.json("results.json")
    return data


class TestXidsFromTheRealKernelLog:
    def test_reads_the_real_device(self, guest_run: dict[str, Any]) -> None:
        assert guest_run["source"] == "kmsg"
        assert guest_run["kmsg_char"][:2] == [1, 11]  # the kernel's /dev/kmsg (mem 1:11)
        assert len(guest_run["boot_id"]) == 36

    def test_an_earlier_boots_condition_is_cleared_first(self, guest_run: dict[str, Any]
                                                         ) -> None:
        assert guest_run["cleared"] is True and guest_run["after_clear"] == []
        cleared = guest_run["events"][0]
        assert (cleared["reason"], cleared["type"]) == ("XidCriticalErrorCleared", "Normal")
        assert guest_run["boot_id"] in cleared["message"]

    def test_the_backlog_then_a_live_xid_become_the_condition(self, guest_run: dict[str, Any]
                                                              ) -> None:
        assert guest_run["rounds"] == [[[GPU, 48]], [[GPU, 79]]]
        condition = guest_run["conditions"][health.CONDITION]
        assert condition["status"] == "True" and condition["reason"] == "Xid:48,79"
        assert condition["message"] == guest_run["boot_id"]
        assert set(guest_run["conditions"]) == {health.CONDITION}
        assert guest_run["errors"] == []

    def test_one_warning_event_per_critical_xid(self, guest_run: dict[str, Any]) -> None:
        xid_events = [e for e in guest_run["events"] if e["reason"] == "XIDError"]
        assert [e["type"] for e in xid_events] == ["Warning", "Warning"]
        assert xid_events[0]["message"].startswith(
            f"critical Xid 48 on GPU {GPU}: pid=1234, name=train.py, An uncorrectable double")
        assert xid_events[1]["message"] == (
            f"critical Xid 79 on GPU {GPU}: pid=4242, name=train.py, GPU has fallen off the "
            f"bus. (boot {guest_run['boot_id']})")

    def test_application_xids_are_counted_not_reported(self, guest_run: dict[str, Any]
                                                       ) -> None:
        assert guest_run["counts"] == {GPU: {"48": 1, "79": 1}, "0000:00:06": {"13": 1}}
        logged = [(line["xid"], line["critical"]) for line in guest_run["log"]
                  if line["event"] == "GPU Xid"][:3]
        assert logged == [(48, True), (13, False), (79, True)]

    def test_a_restarted_agent_rereads_the_log_and_writes_nothing(
            self, guest_run: dict[str, Any]) -> None:
        assert guest_run["restart_counts"] == guest_run["counts"]
        assert guest_run["restart_new"] == [[GPU, 48], [GPU, 79]]
        assert guest_run["restart_events"] == 0
