"""agent.health and node.kmsg: Xids read from a kernel log and from NVML events, counted per
GPU; which Xids are critical (XID_CRITICAL). Reports to the API: test_health_report.py.

The kernel log is a FIFO (or a plain file) at <dev root>/kmsg in a temp host tree, written
in /dev/kmsg's record format; the real device is read in the kernel tier
(tests/kernel/test_health_kernel.py). The NVML path runs against a stand-in module object
with pynvml's own function names, errors and event struct (`FakeNvml` below).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from healthkit import BOOT, XID13, XID48_OLD, XID79, host_tree, record
from hypothesis import given
from hypothesis import strategies as st

from installer.agent import health
from installer.agent.health import Health, Xid
from installer.agent.xids import (
    KmsgXidSource,
    NoXidSource,
    NvmlXidSource,
    Refused,
    accepted_xids,
    judge,
    node_gpus,
    parse_xid,
)
from installer.config import load_config
from installer.errors import ConfigError
from installer.node import kmsg
from installer.node.host import RealHost


class TestParseRecord:
    def test_a_kernel_record_with_its_dictionary_lines(self) -> None:
        lines = record(812, XID79, dictionary=("SUBSYSTEM=pci", "DEVICE=+pci:0000:3b:00.0"))
        first, *rest = lines.decode().splitlines()
        parsed = kmsg.parse_record(first)
        assert parsed == kmsg.KmsgRecord(3, 0, 812, 812017, XID79)
        assert [kmsg.parse_record(line) for line in rest] == [None, None]

    def test_the_caller_field_of_newer_kernels_and_a_user_facility(self) -> None:
        parsed = kmsg.parse_record(f"11,339,5140900,-,caller=T1;{XID79}")
        assert parsed is not None and (parsed.level, parsed.facility, parsed.seq) == (3, 1, 339)
        assert parsed.message == XID79

    @pytest.mark.parametrize("line", ["", "hello", "3,1,2;too few fields", "a,b,c,-;x",
                                      "3,-1,5,-;negative seq", " 3,1,2,-;indented",
                                      "3,1,2,-" + "no separator"])
    def test_garbage_is_no_record(self, line: str) -> None:
        assert kmsg.parse_record(line) is None

    @given(st.text(max_size=200))
    def test_any_text_parses_or_is_refused_without_raising(self, line: str) -> None:
        parsed = kmsg.parse_record(line)
        assert parsed is None or parsed.seq >= 0


class TestParseXid:
    def test_the_current_driver_line(self) -> None:
        assert parse_xid(XID79) == Xid("0000:3b:00", 79,
                                       "pid=2211, name=python3, GPU has fallen off the bus.")

    def test_an_older_driver_line_without_pci_prefix_and_upper_case(self) -> None:
        xid = parse_xid(XID48_OLD)
        assert xid is not None and (xid.gpu, xid.code) == ("0000:00:1e", 48)
        assert xid.detail.startswith("An uncorrectable double bit error")

    def test_an_eight_digit_domain_and_a_function_map_to_the_kernel_name(self) -> None:
        xid = parse_xid("NVRM: Xid (PCI:00000000:18:00.0): 119, pid=1582, name=nvidia-smi, "
                        "Timeout after 6s of waiting for RPC response from GPU0 GSP!")
        assert xid is not None and (xid.gpu, xid.code) == ("0000:18:00", 119)

    @pytest.mark.parametrize("message", [
        "NVRM: GPU at PCI:0000:3b:00: GPU-5a3f6c1e-8d2b-4f9a-b1c3-2e4d5f6a7b8c",
        "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x56:1474)",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.261.03",
        "NVRM: Xid (PCI:zzzz:3b:00): 79, garbage address",
        f'audit: type=1400 comm="{XID79}"',
        "usb 1-1: new high-speed USB device number 2 using xhci_hcd"])
    def test_other_lines_are_no_xid(self, message: str) -> None:
        assert parse_xid(message) is None

    def test_a_long_detail_is_cut(self) -> None:
        xid = parse_xid(XID79 + " x" * 400)
        assert xid is not None and len(xid.detail) == 300


class TestKmsgReader:
    def test_records_arrive_in_order_with_dictionary_lines_and_garbage_dropped(
            self, fifo_host: tuple[RealHost, int]) -> None:
        host, writer = fifo_host
        log = kmsg.open_kmsg(host)
        os.write(writer, record(10, "Linux version 6.1.0") + b"not a record\n"
                 + record(11, XID79, dictionary=("SUBSYSTEM=pci",)))
        got = log.wait(5)
        assert [(r.seq, r.message) for r in got] == [(10, "Linux version 6.1.0"), (11, XID79)]
        log.close()

    def test_a_record_split_across_reads_is_kept_whole(
            self, fifo_host: tuple[RealHost, int]) -> None:
        host, writer = fifo_host
        log = kmsg.open_kmsg(host)
        data = record(5, XID79)
        os.write(writer, data[:20])
        assert log.wait(0.05) == []
        os.write(writer, data[20:])
        assert [r.message for r in log.wait(5)] == [XID79]

    def test_records_read_before_are_skipped_and_overwritten_ones_counted(
            self, fifo_host: tuple[RealHost, int]) -> None:
        host, writer = fifo_host
        log = kmsg.open_kmsg(host)
        os.write(writer, record(7, "a") + record(7, "a again") + record(6, "older")
                 + record(10, "after a gap"))
        assert [r.seq for r in log.wait(5)] == [7, 10]
        assert log.last_seq == 10 and log.lost == 2

    def test_wait_returns_when_a_record_comes(self, fifo_host: tuple[RealHost, int]) -> None:
        host, writer = fifo_host
        log = kmsg.open_kmsg(host)
        threading.Timer(0.3, os.write, (writer, record(1, XID79))).start()
        assert [r.seq for r in log.wait(120)] == [1]  # not the 120 s: the select woke it

    def test_an_empty_log_waits_out_the_timeout(self, fifo_host: tuple[RealHost, int]) -> None:
        host, _ = fifo_host
        log = kmsg.open_kmsg(host)
        started = time.monotonic()
        assert log.wait(0.2) == []
        assert time.monotonic() - started >= 0.2  # it slept (a lower bound only)

    def test_a_plain_file_is_read_once_then_waits(self, tmp_path: Path) -> None:
        host = host_tree(tmp_path)
        (tmp_path / "dev/kmsg").write_bytes(record(1, XID79) + record(2, XID13))
        log = kmsg.open_kmsg(host)
        assert [r.seq for r in log.wait(1)] == [1, 2]
        assert log.wait(0.1) == []

    def test_boot_id_through_the_seam(self, tmp_path: Path) -> None:
        host = host_tree(tmp_path)
        assert kmsg.boot_id(host) == BOOT
        (tmp_path / "proc/sys/kernel/random/boot_id").unlink()
        assert kmsg.boot_id(host) == ""


class TestAcceptedXids:
    """Only the kernel's own `NVRM: Xid (` records, for a GPU sysfs lists, are Xids."""

    def records(self, *lines: tuple[int, str]) -> list[kmsg.KmsgRecord]:
        parsed = [kmsg.parse_record(record(seq, message, prio=prio).decode().splitlines()[0])
                  for seq, (prio, message) in enumerate(lines, start=1)]
        return [r for r in parsed if r is not None]

    def test_only_kernel_records_of_node_gpus(self) -> None:
        found = self.records((3, XID79), (11, XID79), (3, f"audit: comm=\"{XID79}\""),
                             (3, XID13), (4, XID48_OLD))
        gpus = frozenset({"0000:3b:00", "0000:00:1e"})
        assert [(x.gpu, x.code) for x in accepted_xids(found, gpus)] == [
            ("0000:3b:00", 79), ("0000:00:1e", 48)]
        assert [type(v).__name__ if v else None for v in (judge(r, gpus) for r in found)] == [
            "Xid", "Refused", "Refused", "Refused", "Xid"]
        assert [v.cause for v in (judge(r, gpus) for r in found)
                if isinstance(v, Refused)] == ["not-kernel", "not-driver-prefix",
                                               "unknown-gpu"]

    def test_other_kernel_lines_are_neither_xid_nor_refused(self) -> None:
        [loading] = self.records((6, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module"))
        assert judge(loading, frozenset({"0000:3b:00"})) is None

    def test_node_gpus_are_the_gpu_functions_sysfs_lists(self, tmp_path: Path) -> None:
        host = host_tree(tmp_path, ("0000:3b:00.0", "00000000:B1:00.0"))
        audio = tmp_path / "sys/bus/pci/devices/0000:3b:00.1"
        audio.mkdir()
        for name, value in (("vendor", "0x10de"), ("device", "0x1aef"), ("class", "0x040300")):
            (audio / name).write_text(value + "\n")
        assert node_gpus(host) == frozenset({"0000:3b:00", "0000:b1:00"})


class TestOpenSource:
    def test_kmsg_when_nvml_is_not_asked_for(self, fifo_host: tuple[RealHost, int]) -> None:
        host, writer = fifo_host
        source = health.open_xid_source(host, use_nvml=False)
        assert isinstance(source, KmsgXidSource) and source.kind == "kmsg"
        os.write(writer, record(1, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module")
                 + record(2, XID79) + record(3, XID48_OLD))
        assert [(x.gpu, x.code) for x in source.wait(5)] == [("0000:3b:00", 79),
                                                               ("0000:00:1e", 48)]
        source.close()

    def test_kmsg_when_nvml_has_no_xid_events(self, fifo_host: tuple[RealHost, int]) -> None:
        host, _ = fifo_host
        nvml = FakeNvml(gpus=2, supported=0)
        source = health.open_xid_source(host, use_nvml=True, nvml=nvml)
        assert source.kind == "kmsg" and nvml.freed == 1

    def test_nothing_readable_sleeps_and_says_why(self, tmp_path: Path) -> None:
        source = health.open_xid_source(host_tree(tmp_path), use_nvml=False)
        assert isinstance(source, NoXidSource) and source.kind == "none"
        assert "dev/kmsg" in source.why and "No such file" in source.why
        assert source.wait(0.01) == []


class FakeNvml:
    """pynvml's Xid-event functions over scripted GPUs: pynvml's errors, constants, handle
    and event types, so NvmlXidSource runs as it would against the library."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, gpus: int, supported: int = pynvml.nvmlEventTypeXidCriticalError,
                 unsupported: tuple[int, ...] = ()) -> None:
        self._structs = [pynvml.struct_c_nvmlDevice_t() for _ in range(gpus)]
        self.handles = [ctypes.pointer(s) for s in self._structs]
        self.supported = supported
        self.unsupported = unsupported
        self.registered: list[int] = []
        self.queue: list[tuple[int, int]] = []  # (gpu index, xid)
        self.fail_with: int | None = None
        self.freed = 0

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.handles)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return ctypes.cast(ctypes.addressof(self._structs[index]), pynvml.c_nvmlDevice_t)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return 0 if self._index(handle) in self.unsupported else self.supported

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError and event_set == "set"
        self.registered.append(self._index(handle))

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        index = self._index(handle)
        if index == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.nvmlPciInfo_t()
        info.busId = f"00000000:{0x3B + index:02X}:00.0".encode()
        return info

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        if self.fail_with is not None:
            raise pynvml.NVMLError(self.fail_with)
        if not self.queue:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        index, xid = self.queue.pop(0)
        data = pynvml.c_nvmlEventData_t()
        data.device = self.handles[index]
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        return data

    def _index(self, handle: Any) -> int:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        return [ctypes.addressof(s) for s in self._structs].index(address)


class TestNvmlSource:
    def test_events_become_xids_named_by_pci_address(self) -> None:
        nvml = FakeNvml(gpus=3, unsupported=(2,))
        source = NvmlXidSource(nvml)
        assert nvml.registered == [0, 1] and source.kind == "nvml"
        nvml.queue += [(0, 79), (1, 48)]
        assert source.wait(5) == [Xid("0000:3b:00", 79, "NVML XidCriticalError event"),
                                  Xid("1", 48, "NVML XidCriticalError event")]
        assert source.wait(0.01) == []
        source.close()
        source.close()
        assert nvml.freed == 1

    def test_no_gpu_with_xid_events_is_not_supported(self) -> None:
        nvml = FakeNvml(gpus=2, supported=0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            NvmlXidSource(nvml)
        assert nvml.freed == 1

    def test_a_failed_wait_is_kept_and_sleeps_out_the_timeout(self) -> None:
        nvml = FakeNvml(gpus=1)
        source = NvmlXidSource(nvml)
        nvml.fail_with = pynvml.NVML_ERROR_GPU_IS_LOST
        started = time.monotonic()
        assert source.wait(0.3) == []
        assert time.monotonic() - started >= 0.29  # slept, never a spin (a lower bound)
        assert source.failure == str(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
        nvml.fail_with = None
        nvml.queue.append((0, 79))
        assert [x.code for x in source.wait(1)] == [79] and source.failure is None


class TestHealth:
    def test_counts_per_gpu_and_new_critical_once(self) -> None:
        watch = Health({48, 79})
        a79, b79, a13 = Xid("0000:3b:00", 79, ""), Xid("0000:86:00", 79, ""), \
            Xid("0000:3b:00", 13, "")
        assert watch.observe([a79, a13, a79]) == [a79]
        assert watch.observe([a79, b79]) == [b79]
        assert watch.counts["0000:3b:00"] == {79: 3, 13: 1}
        assert watch.summary() == "0000:3b:00 Xid 13 x1, Xid 79 x3; 0000:86:00 Xid 79 x1"
        assert Health({48}).summary() == "no Xid"

    def test_application_errors_are_never_critical(self) -> None:
        watch = Health({13, 48, 31})
        assert watch.critical == {48}
        assert watch.observe([Xid("0000:3b:00", 13, ""), Xid("0000:3b:00", 31, "")]) == []

    def test_the_setting_defaults_to_gke_and_always_holds_48(self, tmp_path: Path) -> None:
        roots = {"host_root": str(tmp_path), "proc_root": str(tmp_path),
                 "sys_root": str(tmp_path)}
        assert load_config(roots, {}).xid_critical == (48, 63, 64, 79, 119, 120, 123, 140)
        chosen = load_config(roots, {"XID_CRITICAL": "94 95,"})
        assert health.critical_set(chosen) == {48, 94, 95}
        assert health.critical_set(load_config(roots, {"XID_CRITICAL": ""})) == {48}

    @pytest.mark.parametrize(("value", "why"), [
        ("79,13", "Xid 13 is an application error"), ("79,x", "'x' is not an Xid number"),
        ("0", "Xid 0 is out of range"), ("1000", "Xid 1000 is out of range (1 to 999)")])
    def test_bad_settings_are_refused_with_one_line(self, value: str, why: str) -> None:
        with pytest.raises(ConfigError) as refused:
            load_config({}, {"XID_CRITICAL": value})
        assert refused.value.code == 2
        line = refused.value.one_line()
        assert f"XID_CRITICAL='{value}' is invalid: {why}" in line and "\n" not in line

    def test_the_cli_refuses_an_application_xid_before_any_io(self, tmp_path: Path) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "installer", "detect", "--host-root", str(tmp_path),
             "--proc-root", str(tmp_path), "--sys-root", str(tmp_path), "--log-format",
             "console"], env={**os.environ, "XID_CRITICAL": "79 43"}, capture_output=True,
            text=True, timeout=120, check=False)
        assert done.returncode == 2, done.stderr
        assert "XID_CRITICAL='79 43' is invalid: Xid 43 is an application error" in done.stderr
        assert "xid-critical must be Xid numbers" in done.stderr
        assert list(tmp_path.iterdir()) == []
