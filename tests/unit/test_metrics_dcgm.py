"""dcgm-exporter's names (METRICS_DCGM_NAMES): the product's table against a transcription of
dcgm-exporter's default counters made for this test (its profiling rows from GPM too), the
family rendered through prometheus-client's registry in both exposition formats, and
`promtool check metrics`."""

from __future__ import annotations

import gzip
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus import check_metrics
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from installer.agent.metrics import dcgm
from installer.agent.metrics.gpm import METRICS
from installer.agent.metrics.server import SnapshotCollector, make_app
from installer.agent.metrics.snapshot import GpmReading, GpuReading, Snapshot
from installer.config import SETTINGS_BY_NAME, load_config
from installer.errors import ConfigError
from installer.node.podresources import ContainerDevices

MIB = 1024 * 1024
# NVIDIA/dcgm-exporter etc/default-counters.csv at d5e5f510a1b6b393f39a43293ccd9dc985defc79,
# the rows the agent serves, transcribed for this test: field -> (type, unit in its help).
DEFAULT_COUNTERS = {
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "C"),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "W"),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "%"),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", ""),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "MiB"),
    "DCGM_FI_DEV_FB_USED": ("gauge", "MiB"),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "MiB"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", ""),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", ""),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", ""),
    "DCGM_FI_DRIVER_VERSION": ("label", ""),
}
# The same file's Datacenter Profiling (DCP) rows that NVML's GPM measures: field -> (type,
# unit in its help, whether the row is active there: SM_ACTIVE and SM_OCCUPANCY are
# commented out, opt-ins).
DCP_COUNTERS = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "ratio", True),
    "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "ratio", False),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gauge", "ratio", False),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "ratio", True),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "ratio", True),
}
# render_metrics.go's gpuMetricsFormat (release 4.5.3-4.8.2), and the pod mapping's labels
LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
          "DCGM_FI_DRIVER_VERSION", "namespace", "pod", "container"}
DRIVER = "580.95.05"
HOLDER_NAMES = ("namespace", "pod", "container")
SAMPLE = re.compile(r"(?P<name>\w+)\{(?P<labels>.*)\} (?P<value>\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def gpu(index: int, **readings: Any) -> GpuReading:
    values: dict[str, Any] = {
        "duty_cycle": 40.0 + index, "memory_used": (1000 + index + 455) * MIB + 12345,
        "memory_total": 81559 * MIB, "memory_reserved": 455 * MIB,
        "temperature": 50.0 + index, "power_watts": 200.5 + index,
        "remapped": {"correctable": index, "uncorrectable": 2, "pending": 0, "failure": 0}}
    values.update(readings)
    values["memory_free"] = values["memory_total"] - values["memory_used"]
    return GpuReading(index=index, uuid=f"GPU-{index:08d}-0000-4000-8000-000000000000",
                      model="NVIDIA H100 80GB HBM3",
                      pci_bus_id=f"00000000:{index + 0x1a:02X}:00.0", **values)


SNAP = Snapshot(
    taken_at=0, node_name="gpu-node-1", driver_version=DRIVER,
    gpus=(gpu(0), gpu(1), gpu(2)),
    last_xids=(("0000:1b:00", 79), ("2", 13)),
    containers=(ContainerDevices("ml", "train", "main", "nvidia.com/gpu",
                                 ("GPU-00000000-0000-4000-8000-000000000000",)),
                ContainerDevices("ml", "a", "main", "nvidia.com/gpu.shared",
                                 ("GPU-00000001-0000-4000-8000-000000000000::0",)),
                ContainerDevices("ml", "b", "main", "nvidia.com/gpu.shared",
                                 ("GPU-00000001-0000-4000-8000-000000000000::1",))))


class Log:
    def error(self, event: str, **fields: object) -> None:
        raise AssertionError(f"{event} {fields}")


def exposition(snap: Snapshot = SNAP) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap, Log(), dcgm_names=True))
    return dcgm.text_headers(generate_latest(registry)).decode()


def dcgm_series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The DCGM samples by the names the text gives them (prometheus-client's parser would
    add `_total` to a counter's)."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        sample = SAMPLE.fullmatch(line)
        if sample and sample["name"].startswith("DCGM_"):
            labels = dict(LABEL.findall(sample["labels"]))
            found.setdefault(sample["name"], []).append((labels, float(sample["value"])))
    return found


def value(text: str, name: str, gpu_index: int, pod: str = "") -> float:
    (found,) = [v for labels, v in dcgm_series(text)[name]
                if labels["gpu"] == str(gpu_index) and labels.get("pod", "") == pod]
    return found


@pytest.mark.parametrize("name", sorted(DEFAULT_COUNTERS))
def test_the_table_matches_default_counters_field_by_field(name: str) -> None:
    (field,) = [f for f in dcgm.FIELDS if f.name == name]
    assert (field.kind, field.unit, field.default) == (*DEFAULT_COUNTERS[name], True)


@pytest.mark.parametrize("name", sorted(DCP_COUNTERS))
def test_the_profiling_fields_match_the_dcp_rows(name: str) -> None:
    (field,) = [f for f in dcgm.FIELDS if f.name == name]
    assert (field.kind, field.unit, field.default) == DCP_COUNTERS[name]
    assert dcgm.PROFILING[name] in METRICS  # a metric the GPM reader asks NVML for


def test_the_table_has_no_field_the_transcription_lacks() -> None:
    assert [f.name for f in dcgm.FIELDS
            if f.name not in DEFAULT_COUNTERS and f.name not in DCP_COUNTERS] == []


def test_families_carry_dcgm_names_types_and_labels() -> None:
    text = exposition()
    types = {f.name: f.type for f in text_string_to_metric_families(text)
             if f.name.startswith("DCGM_")}
    assert types == {name: kind for name, (kind, _) in DEFAULT_COUNTERS.items()
                     if kind != "label"}
    for name, rows in dcgm_series(text).items():
        assert name in DEFAULT_COUNTERS
        for labels, _ in rows:
            assert set(labels) == LABELS
            assert labels["DCGM_FI_DRIVER_VERSION"] == DRIVER
            assert labels["Hostname"] == "gpu-node-1"
            assert labels["device"] == f"nvidia{labels['gpu']}"
    assert "DCGM_FI_PROF_" not in text  # no GPM reading (GPM off): no profiling family
    # dcgm-exporter's counter lines: no `_total` anywhere, the TYPE line names the samples
    assert "# TYPE DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS counter\n" in text
    assert "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS_total" not in text


def test_values_in_dcgm_units() -> None:
    text = exposition()
    assert value(text, "DCGM_FI_DEV_GPU_UTIL", 2) == 42.0
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", 2) == 52.0
    assert value(text, "DCGM_FI_DEV_POWER_USAGE", 2) == 202.5
    # whole MiB; reserved is neither used nor free: total = used + free + reserved
    used, free, reserved = (value(text, f"DCGM_FI_DEV_FB_{kind}", 2)
                            for kind in ("USED", "FREE", "RESERVED"))
    assert (used, reserved) == (1002, 455)
    assert used + free + reserved == 81559 - 1  # the 12345 bytes: one MiB split in two
    assert used + free != 81559
    assert value(text, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 2) == 2
    assert value(text, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 2) == 2
    assert value(text, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 2) == 0


GPM = {"graphics_active": 90.0, "sm_active": 62.5, "sm_occupancy": 25.0,
       "tensor_active": 40.0, "dram_active": 12.5}
GPM_SNAP = replace(SNAP, gpus=(
    gpu(0, gpm=GpmReading(True, values=GPM)),
    gpu(1, gpm=GpmReading(True, values={**GPM, "sm_active": 10.0, "tensor_active": 0.0})),
    gpu(2, gpm=GpmReading(False, reason="the GPU has no GPM (Hopper and later have it)"))))


def test_profiling_fields_are_gpm_ratios_per_gpu() -> None:
    text = exposition(GPM_SNAP)
    types = {f.name: f.type for f in text_string_to_metric_families(text)
             if f.name.startswith("DCGM_FI_PROF_")}
    assert types == {name: kind for name, (kind, _, _) in DCP_COUNTERS.items()}
    series = dcgm_series(text)
    for name, metric in dcgm.PROFILING.items():
        # GPU 2 has no GPM: no profiling series for it (its other fields stay)
        assert sorted(labels["gpu"] for labels, _ in series[name]) == ["0", "1"], name
        assert value(text, name, 0, pod="train") == GPM[metric] / 100
        for labels, _ in series[name]:
            assert set(labels) == LABELS
    assert value(text, "DCGM_FI_PROF_SM_ACTIVE", 1) == 0.1
    assert value(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1) == 0.0  # idle is 0, not absent
    assert value(text, "DCGM_FI_DEV_GPU_UTIL", 2) == 42.0


def test_profiling_fields_leave_out_a_metric_nvml_refused() -> None:
    snap = replace(SNAP, gpus=(gpu(0, gpm=GpmReading(True, values={"sm_active": 50.0})),))
    series = dcgm_series(exposition(snap))
    assert [n for n in series if n.startswith("DCGM_FI_PROF_")] == ["DCGM_FI_PROF_SM_ACTIVE"]


def test_last_xid_by_pci_address_or_index_and_zero_without() -> None:
    text = exposition()
    assert value(text, "DCGM_FI_DEV_XID_ERRORS", 1) == 79  # GPU 1 is 0000:1b:00
    assert value(text, "DCGM_FI_DEV_XID_ERRORS", 2) == 13  # named by its NVML index
    assert value(text, "DCGM_FI_DEV_XID_ERRORS", 0, pod="train") == 0


def test_one_series_per_gpu_named_by_its_sole_holder() -> None:
    rows = dcgm_series(exposition())["DCGM_FI_DEV_GPU_UTIL"]
    holders = sorted((labels["gpu"], *(labels.get(k, "") for k in HOLDER_NAMES))
                     for labels, _ in rows)
    # GPU 1 is time-sliced to pods a and b: one series, no pod named
    assert holders == [("0", "ml", "train", "main"), ("1", "", "", ""), ("2", "", "", "")]


def test_readings_nvml_did_not_give_are_absent() -> None:
    snap = Snapshot(taken_at=0, gpus=(gpu(0, memory_reserved=None, temperature=None,
                                          remapped={}),))
    series = dcgm_series(exposition(snap))
    assert "DCGM_FI_DEV_FB_RESERVED" not in series and "DCGM_FI_DEV_GPU_TEMP" not in series
    assert "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS" not in series
    assert value(exposition(snap), "DCGM_FI_DEV_FB_USED", 0) == 1455  # v1: reserved in used
    # no node name: no Hostname, as dcgm-exporter; no holder: empty pod labels (with the
    # PodMonitor's honorLabels an absent `pod` would name the agent's pod)
    (labels, _), = series["DCGM_FI_DEV_FB_USED"]
    assert set(labels) == LABELS - {"Hostname"}
    assert [labels[k] for k in HOLDER_NAMES] == ["", "", ""]


def test_off_by_default_and_the_setting_turns_it_on(tmp_path: Path) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: SNAP, Log()))
    assert "DCGM_" not in generate_latest(registry).decode()
    setting = SETTINGS_BY_NAME["metrics_dcgm_names"]
    assert (setting.envvar, setting.default) == ("METRICS_DCGM_NAMES", "false")
    roots = {"HOST_ROOT": str(tmp_path), "PROC_ROOT": str(tmp_path), "SYS_ROOT": str(tmp_path)}
    assert load_config({}, {**roots, "METRICS_DCGM_NAMES": "true"}).metrics_dcgm_names is True
    assert load_config({}, roots).metrics_dcgm_names is False
    with pytest.raises(ConfigError, match="METRICS_DCGM_NAMES"):
        load_config({}, {**roots, "METRICS_DCGM_NAMES": "yes please"})


def _get(accept: str, encoding: str = "") -> tuple[dict[str, str], bytes]:
    app = make_app(lambda: SNAP, 5.0, Log(), dcgm_names=True)
    answer: list[Any] = []

    def start(status: str, headers: list[tuple[str, str]], *_: object) -> None:
        answer.extend((status, headers))

    body = b"".join(app({"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET", "QUERY_STRING": "",
                         "HTTP_ACCEPT": accept, "HTTP_ACCEPT_ENCODING": encoding}, start))
    assert answer[0] == "200 OK"
    return dict(answer[1]), body


def test_served_in_both_formats_and_gzipped() -> None:
    headers, body = _get("text/plain", "gzip")
    assert headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(body).decode()
    assert "# TYPE DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS counter\n" in text
    assert "# TYPE gpu_node_installer_xid_errors_total counter\n" in text  # ours untouched
    headers, body = _get("application/openmetrics-text; version=1.0.0")
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert "Content-Encoding" not in headers
    assert "# TYPE DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS counter\n" in body.decode()


# promtool's naming lint on dcgm-exporter's own names and labels, which dashboards need as
# they are: counters without `_total`; `modelName` on every family.
DCGM_LINT = {
    'DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS counter metrics should have "_total" suffix',
    'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS counter metrics should have "_total" suffix',
    *(f"{name} label names should be written in 'snake_case' not 'camelCase'"
      for name, (kind, _) in DEFAULT_COUNTERS.items() if kind != "label"),
}


@pytest.mark.parametrize("snap", [SNAP, GPM_SNAP], ids=["gpm-off", "gpm-on"])
def test_promtool_check_metrics(snap: Snapshot) -> None:
    text = exposition(snap)
    checked = check_metrics(text)
    assert checked.returncode in (0, 3), checked.stdout + checked.stderr  # 3: lint only
    findings = {line for line in checked.stderr.strip().splitlines()
                if line.startswith("DCGM_")}
    profiling = {f"{name} label names should be written in 'snake_case' not 'camelCase'"
                 for name in DCP_COUNTERS} if snap is GPM_SNAP else set()
    assert findings == DCGM_LINT | profiling, findings
