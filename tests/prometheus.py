"""A real Prometheus (Debian's `prometheus` package) scraping given targets, for tests.

    with running([f"127.0.0.1:{port}"], tmp_path) as prom:  # returns once scraped
        series = prom.query('duty_cycle{namespace="ml"}')

It listens on 127.0.0.1 (a free port), keeps its TSDB in the given temp dir, scrapes every
second, yields once every target was scraped, and answers PromQL through its HTTP API
(`/api/v1/query`). `honor_labels` and `target_labels` reproduce what the PodMonitor in
daemonset/examples/metrics/ gives a scrape in a cluster (the agent pod's own
namespace/pod/container as target labels; the workload's labels on per-container series
win). `promtool` (same package) checks exposition text.
`PROMETHEUS_BIN` overrides the binary; tests skip, saying why, only when it is absent
(`make deps` installs it; CI does).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

JOB = "gpu-node-installer"
START_S = 60.0  # a loaded 2-core machine: the TSDB and the web server start within this
SCRAPE_S = 60.0


def binary(name: str = "prometheus") -> str:
    """The binary's path, or skip the test naming the package that provides it."""
    found = os.environ.get(f"{name.upper()}_BIN") or shutil.which(name)
    if not found:
        pytest.skip(f"{name} not installed: `make deps` installs Debian's prometheus package "
                    f"(it ships prometheus and promtool)")
    return found


def check_metrics(text: str) -> subprocess.CompletedProcess[str]:
    """`promtool check metrics` on exposition text (lint problems on stderr, exit 1/3)."""
    return subprocess.run([binary("promtool"), "check", "metrics"], input=text,
                          capture_output=True, text=True, timeout=60, check=False)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET /api/v1/<path>; the `data` of a success, else an AssertionError with its text."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=30) as reply:
                answer = json.load(reply)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{path} {params}: HTTP {exc.code}: {exc.read()[:500]!r}"
                                 ) from exc
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result: [{"metric": {labels}, "value": [time, "text"]}, ...]."""
        data = self.api("query", {"query": promql})
        result = data["result"]
        assert isinstance(result, list), f"{promql}: {data['resultType']} result, not a vector"
        return result

    def values(self, promql: str) -> dict[frozenset[tuple[str, str]], float]:
        """An instant query as {labels (without __name__): value}."""
        return {frozenset((k, v) for k, v in row["metric"].items() if k != "__name__"):
                float(row["value"][1]) for row in self.query(promql)}

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def wait_scraped(self, after: float | None = None, timeout_s: float = SCRAPE_S) -> None:
        """Until every target has been scraped successfully (after `after`, a time.time())."""
        deadline = time.monotonic() + timeout_s
        seen: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            seen = self.targets()
            if seen and all(t["health"] == "up" and _scraped_after(t, after) for t in seen):
                return
            time.sleep(0.2)
        raise AssertionError(f"targets not scraped within {timeout_s} s: "
                             f"{[(t['scrapeUrl'], t['health'], t['lastError']) for t in seen]}")


def _scraped_after(target: Mapping[str, Any], after: float | None) -> bool:
    """Whether the target's last scrape (RFC 3339, nanoseconds) came after `after`."""
    if after is None:
        return True
    return datetime.fromisoformat(str(target["lastScrape"])).timestamp() > after


def config(targets: list[str], *, honor_labels: bool = True,
           target_labels: Mapping[str, str] | None = None,
           scrape: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """prometheus.yml: one job scraping the targets every second (`scrape`: more of the
    job's settings, e.g. scheme, basic_auth, tls_config)."""
    static: dict[str, Any] = {"targets": targets}
    if target_labels:
        static["labels"] = dict(target_labels)
    return {"global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": JOB, "honor_labels": honor_labels,
                                "static_configs": [static], **(scrape or {})}]}


@contextmanager
def running(targets: list[str], workdir: Path, *, honor_labels: bool = True,
            target_labels: Mapping[str, str] | None = None,
            scrape: Mapping[str, Any] | None = None) -> Iterator[Prometheus]:
    """Prometheus on 127.0.0.1:<free port> scraping the targets, its data in workdir, once
    it has scraped every target successfully."""
    exe = binary()
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config(targets, honor_labels=honor_labels,
                                                 target_labels=target_labels, scrape=scrape)))
    check = subprocess.run([binary("promtool"), "check", "config", str(config_file)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    port = _free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [exe, f"--config.file={config_file}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
             "--storage.tsdb.retention.time=1h"],
            stdout=sink, stderr=subprocess.STDOUT, cwd=workdir)
    prom = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        _wait_ready(prom)
        prom.wait_scraped()  # every target answered once: queries see data from here on
        yield prom
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _wait_ready(prom: Prometheus) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if prom.process.poll() is not None:
            raise AssertionError(f"prometheus exited {prom.process.returncode}: "
                                 f"{prom.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"prometheus not ready within {START_S} s: {prom.log.read_text()[-2000:]}")
