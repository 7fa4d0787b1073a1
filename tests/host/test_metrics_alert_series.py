"""The series the alert tests replay (tests/deploy/alerts/agent-sample-node.prom) are the ones
the agent serves on the sample node: the 8-GPU host tree and kubelet scene of
test_metrics_prometheus.py (five whole GPUs, a time-sliced one, a DRA claim, an Xid 13, the
fabric complete), scraped once.

The file is the agent's exposition as served. `GNI_RECORD_ALERT_SERIES=1` rewrites it from
the running agent; otherwise each series (name and labels; values vary with time) must
still be served, so a renamed metric or label fails here before the alert tests go stale.
Label values that are content digests (the package's) differ with the machine that built
the sample package, so only their presence is compared.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from agentnode import AgentNode
from host.test_metrics_prometheus import kubelet, scraped
from prometheus import Prometheus
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["kubelet", "scraped"]  # the scene, as fixtures
RECORDED = Path(__file__).resolve().parents[1] / "deploy" / "alerts" / "agent-sample-node.prom"
HEADER = ("# The node agent's /metrics on the sample node of tests/host/test_metrics_prometheus.py"
          "\n# (8 A100 GPUs), recorded by tests/host/test_metrics_alert_series.py.\n")


VARYING = frozenset({"package_digest"})


def series(text: str) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    return {(s.name, frozenset((k, "<digest>" if k in VARYING else v)
                               for k, v in s.labels.items()))
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_recorded_series_are_what_the_agent_serves(
        scraped: tuple[AgentNode, Prometheus, str]) -> None:
    _, _, base = scraped
    with urllib.request.urlopen(base + "/metrics", timeout=30) as reply:
        text = reply.read().decode()
    if os.environ.get("GNI_RECORD_ALERT_SERIES") == "1":
        RECORDED.write_text(HEADER + text)
    recorded = series(RECORDED.read_text())
    assert len(recorded) > 100
    assert recorded <= series(text), sorted(recorded - series(text))
