"""/metrics formatted once per collection (installer/agent/metrics/exposition.py): the body
a scrape gets is what prometheus-client's own app renders for the same snapshot, in each
format a client may ask for, with only the collection's section formatted per scrape."""

from __future__ import annotations

import gzip
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from installer.agent.metrics.server import make_app
from installer.agent.metrics.snapshot import GpuReading, InstallFacts, Snapshot

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class Log:
    def __getattr__(self, level: str) -> Any:
        return lambda *args, **fields: None


def snapshot(duty: float) -> Snapshot:
    gpus = tuple(GpuReading(index=i, uuid=f"GPU-{i}", model="NVIDIA H100 80GB HBM3",
                            pci_bus_id=f"00000000:{i + 16:02X}:00.0", duty_cycle=duty)
                 for i in range(2))
    return Snapshot(taken_at=time.time() - 3, install=InstallFacts(driver_version="570.1"),
                    gpus=gpus)


def get(app: Any, accept: str = "", encoding: str = "", query: str = ""
        ) -> tuple[str, dict[str, str], bytes]:
    answer: list[Any] = []
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": query,
               "HTTP_ACCEPT": accept, "HTTP_ACCEPT_ENCODING": encoding}
    body = b"".join(app(environ, lambda status, headers: answer.extend((status, headers))))
    return answer[0], dict(answer[1]), body


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def scene() -> tuple[Any, list[Snapshot]]:
    current = [snapshot(40.0)]
    return make_app(lambda: current[0], 5.0, Log()), current


def test_text_body_is_the_whole_rendering(scene: tuple[Any, list[Snapshot]]) -> None:
    app, _ = scene
    status, headers, body = get(app)
    _, _, full = get(app, query="x=1")  # prometheus-client's own app renders all
    assert status == "200 OK" and headers["Content-Type"].startswith("text/plain")
    ours, theirs = samples(body.decode()), samples(full.decode())
    age = [k for k in ours if k[0] == "gpu_node_installer_metrics_age_seconds"]
    assert len(age) == 1 and ours[age[0]] == pytest.approx(3.0, abs=2)
    assert {k: v for k, v in ours.items() if k not in age} == {
        k: v for k, v in theirs.items() if k not in age}
    assert ours[("gpu_node_installer_gpu_duty_cycle_ratio", frozenset({
        ("gpu", "1"), ("uuid", "GPU-1"), ("model", "NVIDIA H100 80GB HBM3"),
        ("pci_bus_id", "00000000:11:00.0"), ("source", "samples")}))] == 0.4


def test_openmetrics_has_one_eof_at_the_end(scene: tuple[Any, list[Snapshot]]) -> None:
    app, _ = scene
    _, headers, body = get(app, accept=OPENMETRICS)
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.count(b"# EOF\n") == 1 and body.endswith(b"# EOF\n")
    _, _, text = get(app)
    assert b"# EOF" not in text  # each format cached on its own


def test_a_new_snapshot_is_served_and_age_is_live(scene: tuple[Any, list[Snapshot]]) -> None:
    app, current = scene
    first = get(app)[2]
    time.sleep(0.05)
    again = get(app)[2]
    assert first != again  # the age moved; the rest came from the cache
    current[0] = snapshot(80.0)
    body = get(app, encoding="gzip")
    assert body[1]["Content-Encoding"] == "gzip"
    assert b'gpu="1"' in gzip.decompress(body[2])
    assert b"0.8" in gzip.decompress(body[2]) and b"0.4" not in gzip.decompress(body[2])
