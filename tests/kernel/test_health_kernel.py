"""GPU health on a real kernel: the agent reads the guest's real /dev/kmsg, clears an earlier
boot's condition, and refuses Xid lines that user space wrote.

One guest boot: the script writes lines in the NVIDIA driver's format into the kernel's log
as root (`echo '<3>NVRM: Xid (PCI:...): 48, ...' > /dev/kmsg`), then
tests/kernel/health_guest.py runs the agent's health round (`installer.agent.health`)
over the real device: the backlog, a live line written while the round waits, and an agent
restarted in the same boot. The real kernel stores every such write with facility 1
(LOG_USER, Documentation/ABI/testing/dev-kmsg), which is what lets the agent refuse them:
nothing is counted or reported. A line the kernel itself logs (facility 0) is counted; that
path runs on the host tier (tests/host/test_health*.py, records written as the device hands
them out), since only a kernel module could log one here.
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

    def test_the_kernel_marks_user_space_writes_as_such(self, guest_run: dict[str, Any]
                                                        ) -> None:
        assert guest_run["facilities"] == [1, 1, 1]  # LOG_USER, whatever `<N>` asked for

    def test_forged_xids_are_refused_and_nothing_is_reported(self, guest_run: dict[str, Any]
                                                             ) -> None:
        assert guest_run["rounds"] == [[], []]
        assert guest_run["counts"] == {}
        assert guest_run["refused"] == {"not-kernel": 3}
        assert health.CONDITION not in guest_run["conditions"]  # only the old one, cleared
        assert [e["reason"] for e in guest_run["events"]] == ["XidCriticalErrorCleared"]
        assert guest_run["errors"] == []

    def test_a_restarted_agent_rereads_the_log_and_writes_nothing(
            self, guest_run: dict[str, Any]) -> None:
        assert guest_run["restart_counts"] == {}
        assert guest_run["restart_new"] == []
        assert guest_run["restart_events"] == 0
