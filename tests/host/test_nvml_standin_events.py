"""The NVML stand-in's Xid events and persistence mode, through the real pynvml: what the
agent's health watcher and persistenced checks are tested against.

The oracle is NVML's own header, as NVIDIA publishes it in NVIDIA/go-nvml `gen/nvml/nvml.h`
at 2f9e261fe40a7a1c54783d66805e8920564763b4: `nvmlEventSetCreate` (line 9882),
`nvmlEventSetWait_v2` (9979: NVML_ERROR_TIMEOUT when no event arrives within `timeoutms`),
`nvmlEventTypeXidCriticalError` 0x8 (3168, the Xid in `eventData`),
`nvmlDeviceGetPersistenceMode` (5433)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pynvml  # type: ignore[import-untyped]
import pytest
from native.nvmlsession import append_xids, nvml_session

XID = pynvml.nvmlEventTypeXidCriticalError


pytestmark = pytest.mark.usefixtures("xid_file")  # every case: no Xid event but its own


def _event_set(gpus: int) -> object:
    event_set = pynvml.nvmlEventSetCreate()
    for index in range(gpus):
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(index), XID,
                                        event_set)
    return event_set


class TestXidEvents:
    def test_supported_types_include_xid(self, libs: Path) -> None:
        with nvml_session(libs):
            types = pynvml.nvmlDeviceGetSupportedEventTypes(
                pynvml.nvmlDeviceGetHandleByIndex(0))
        assert types & XID

    def test_each_line_is_delivered_once_with_its_gpu(
            self, libs: Path, xid_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_NVML_GPUS", "8")
        with nvml_session(libs):
            event_set = _event_set(8)
            append_xids(xid_file, "3 79\n5 48\n")
            first = pynvml.nvmlEventSetWait_v2(event_set, 1000)
            second = pynvml.nvmlEventSetWait_v2(event_set, 1000)
            seen = [(pynvml.nvmlDeviceGetIndex(e.device), e.eventType, e.eventData)
                    for e in (first, second)]
            with pytest.raises(pynvml.NVMLError) as info:
                pynvml.nvmlEventSetWait_v2(event_set, 100)
            pynvml.nvmlEventSetFree(event_set)
        assert seen == [(3, XID, 79), (5, XID, 48)]
        assert info.value.value == pynvml.NVML_ERROR_TIMEOUT

    def test_wait_returns_a_line_appended_while_waiting(
            self, libs: Path, xid_file: Path) -> None:
        with nvml_session(libs):
            event_set = _event_set(1)
            writer = threading.Timer(0.3, append_xids, (xid_file, "0 13\n"))
            writer.start()
            event = pynvml.nvmlEventSetWait_v2(event_set, 30_000)
            writer.join()
        assert (event.eventType, event.eventData) == (XID, 13)

    def test_timeout_waits_about_its_length(self, libs: Path) -> None:
        """Bounded: it sleeps (no event) for at least the timeout, and returns."""
        with nvml_session(libs):
            event_set = _event_set(1)
            begin = time.monotonic()
            with pytest.raises(pynvml.NVMLError) as info:
                pynvml.nvmlEventSetWait_v2(event_set, 300)
            waited = time.monotonic() - begin
        assert info.value.value == pynvml.NVML_ERROR_TIMEOUT
        assert 0.3 <= waited < 10

    def test_a_partial_line_waits_for_its_newline(self, libs: Path, xid_file: Path) -> None:
        with nvml_session(libs):
            event_set = _event_set(1)
            append_xids(xid_file, "0 4")
            with pytest.raises(pynvml.NVMLError):
                pynvml.nvmlEventSetWait_v2(event_set, 60)
            append_xids(xid_file, "8\n")
            event = pynvml.nvmlEventSetWait_v2(event_set, 1000)
        assert event.eventData == 48

    def test_lines_for_unregistered_gpus_are_dropped(
            self, libs: Path, xid_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_NVML_GPUS", "2")
        with nvml_session(libs):
            event_set = _event_set(1)  # GPU 0 only
            append_xids(xid_file, "1 79\n7 79\n0 63\n")
            event = pynvml.nvmlEventSetWait_v2(event_set, 1000)
            gpu = pynvml.nvmlDeviceGetIndex(event.device)
        assert (gpu, event.eventData) == (0, 63)

    def test_delivered_once_across_event_sets(self, libs: Path, xid_file: Path) -> None:
        """A restarted watcher does not see the old lines again."""
        with nvml_session(libs):
            append_xids(xid_file, "0 79\n")
            assert pynvml.nvmlEventSetWait_v2(_event_set(1), 1000).eventData == 79
            with pytest.raises(pynvml.NVMLError):
                pynvml.nvmlEventSetWait_v2(_event_set(1), 60)

    def test_truncated_file_starts_again(self, libs: Path, xid_file: Path) -> None:
        with nvml_session(libs):
            event_set = _event_set(1)
            append_xids(xid_file, "0 31\n0 43\n")
            pynvml.nvmlEventSetWait_v2(event_set, 1000)
            pynvml.nvmlEventSetWait_v2(event_set, 1000)
            xid_file.write_text("0 94\n")
            assert pynvml.nvmlEventSetWait_v2(event_set, 1000).eventData == 94

    def test_events_unsupported(self, libs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A node where NVML has no events: the watcher must fall back to /dev/kmsg."""
        monkeypatch.setenv("FAKE_NVML_EVENTS", "unsupported")
        with nvml_session(libs):
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            assert pynvml.nvmlDeviceGetSupportedEventTypes(handle) == 0
            with pytest.raises(pynvml.NVMLError) as info:
                pynvml.nvmlDeviceRegisterEvents(handle, XID, pynvml.nvmlEventSetCreate())
        assert info.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED


class TestPersistenceMode:
    def test_enabled_by_default(self, libs: Path) -> None:
        with nvml_session(libs):
            assert pynvml.nvmlDeviceGetPersistenceMode(pynvml.nvmlDeviceGetHandleByIndex(0)) == 1

    def test_follows_the_file(self, libs: Path, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
        mode = tmp_path / "persistence"
        monkeypatch.setenv("FAKE_NVML_PERSISTENCE_FILE", str(mode))
        with nvml_session(libs):
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            missing = pynvml.nvmlDeviceGetPersistenceMode(handle)
            mode.write_text("1\n")
            on = pynvml.nvmlDeviceGetPersistenceMode(handle)
            mode.write_text("0\n")
            off = pynvml.nvmlDeviceGetPersistenceMode(handle)
        assert (missing, on, off) == (0, 1, 0)
