"""agent.health's NVML path through the real pynvml over the compiled NVML stand-in: Xid
events registered on every GPU, delivered per GPU with its PCI address, reported as the
node condition and Event on the strict fake API.

The stand-in (tests/native/nvml_standin.c) delivers each line "<gpu index> <xid>" appended to
FAKE_NVML_XID_FILE once, to event sets registered for XidCriticalError on that GPU, and
answers a wait with NVML_ERROR_TIMEOUT after its timeout.
"""

from __future__ import annotations

import threading
from pathlib import Path

import kubefake
import pynvml
import pytest
from healthkit import BOOT, NODE, Log
from kubefake import Cluster, node_doc
from native.nvmlsession import append_xids, nvml_session

from installer.agent import health
from installer.agent.xids import NvmlXidSource
from installer.node import kube
from installer.node.host import RealHost, Roots


@pytest.fixture(autouse=True)
def _eight_gpus(xid_file: Path, fake_env: pytest.MonkeyPatch) -> None:
    """Every case: the stand-in's eight GPUs, their Xid events from `xid_file`."""
    fake_env.setenv("FAKE_NVML_GPUS", "8")


class TestNvmlXidEvents:
    def test_every_gpu_is_registered_and_named_by_its_pci_address(
            self, libs: Path, xid_file: Path, tmp_path: Path) -> None:
        host = RealHost(Roots(tmp_path, tmp_path, tmp_path, tmp_path))  # no /dev/kmsg there
        with nvml_session(libs):
            source = health.open_xid_source(host, use_nvml=True)
            assert isinstance(source, NvmlXidSource)
            names = sorted(source.gpus.values())
            append_xids(xid_file, "3 79\n5 48\n")
            xids = source.wait(10)
            assert source.wait(0.1) == []
            source.close()
        assert names == [f"0000:{0x10 + i:02x}:00" for i in range(8)]
        assert [(x.gpu, x.code) for x in xids] == [("0000:13:00", 79), ("0000:15:00", 48)]

    def test_a_round_reports_a_live_event_to_the_node(self, libs: Path, xid_file: Path,
                                                      tmp_path: Path) -> None:
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)})
        token = tmp_path / "token"
        token.write_text(kubefake.TOKEN)
        log = Log()
        with nvml_session(libs), kubefake.serve(cluster) as url:
            source = NvmlXidSource(pynvml)
            writer = threading.Timer(0.3, append_xids, (xid_file, "0 13\n7 79\n"))
            writer.start()
            new = health.watch_once(source, health.Health({48, 79}),
                                    api=kube.ApiServer(url, token, None), node=NODE,
                                    boot_id=BOOT, timeout_s=60, log=log)
            writer.join()
            source.close()
        assert [(x.gpu, x.code) for x in new] == [("0000:17:00", 79)]
        condition = kubefake.conditions(cluster)[health.CONDITION]
        assert (condition["reason"], condition["message"]) == ("Xid:79", BOOT)
        assert [e["reason"] for e in cluster.events] == ["XIDError"]
        assert [f["xid"] for _, _, f in log.lines] == [13, 79] and cluster.errors == []
