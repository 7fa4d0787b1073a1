"""tests/prometheus.py itself: the real Prometheus scrapes a target, answers PromQL, and
`honor_labels` keeps a workload's labels over the scraping pod's (what the PodMonitor sets);
promtool tells good exposition text from bad."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus import check_metrics, running

EXPOSITION = """\
# HELP duty_cycle Percent of the sampling window the GPU was busy.
# TYPE duty_cycle gauge
duty_cycle{namespace="ml",pod="train-0",container="trainer",make="nvidia",\
model="nvidia-h100-80gb",accelerator_id="nvidia0"} 42
# HELP gpu_node_installer_ready Whether the node's driver is ready.
# TYPE gpu_node_installer_ready gauge
gpu_node_installer_ready 1
"""
AGENT_POD = {"namespace": "gpu-node-installer", "pod": "gpu-node-installer-x7k2p",
             "container": "agent"}


class _Metrics(BaseHTTPRequestHandler):
    body = EXPOSITION.encode()

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def target() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("honor", [True, False])
def test_scrapes_and_answers_promql(target: str, tmp_path: Path, honor: bool) -> None:
    with running([target], tmp_path / "prom", honor_labels=honor,
                 target_labels=AGENT_POD) as prom:
        prom.wait_scraped(after=time.time())
        ready = prom.values("gpu_node_installer_ready")
        duty = prom.query("duty_cycle")
    # a node-level series takes the agent pod's labels
    ((labels, value),) = ready.items()
    assert value == 1.0 and set(AGENT_POD.items()) <= labels
    ((row),) = duty
    if honor:  # the workload's labels win, as the adapter rule and the HPA need
        assert row["metric"]["pod"] == "train-0" and row["metric"]["namespace"] == "ml"
    else:  # without honorLabels Prometheus renames them: the reason the PodMonitor sets it
        assert row["metric"]["pod"] == AGENT_POD["pod"]
        assert row["metric"]["exported_pod"] == "train-0"
    assert row["value"][1] == "42"


def test_promtool_checks_exposition_text() -> None:
    assert check_metrics(EXPOSITION).returncode == 0
    bad = check_metrics("# TYPE x_total gauge\nx_total{a=\"1\"} one\n")
    assert bad.returncode != 0
