"""check-pod on odd input the corpus does not hold: a Node of any shape (Hypothesis) and GPU
quantities that are no number. Each gives verdicts or one refusal line, never a crash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from unit.test_checkpod_corpus import CORPUS, DRIVER, verdicts

from installer.compat import pods

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8),
                     st.sampled_from(["1", "500m", "2Gi", "nvidia.com/gpu", "NoSchedule"]))
_ANY = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["key", "value", "effect", "nvidia.com/gpu", "operator", "x"]), inner,
    max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(labels=st.dictionaries(st.sampled_from(["cloud.google.com/gke-accelerator",
                                               "nvidia.com/mig.config", "karpenter.sh/nodepool",
                                               "nvidia.com/mig-1g.5gb.count", "x"]),
                              st.text(max_size=6), max_size=3),
       taints=_ANY, allocatable=_ANY)
def test_any_node_shape_is_judged_or_refused_in_one_line(labels: dict[str, str], taints: object,
                                                         allocatable: object) -> None:
    """A Node of any shape gives verdicts for every corpus workload, or one WorkloadError."""
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": labels},
            "spec": {"taints": taints}, "status": {"allocatable": allocatable}}
    try:
        views = pods.node_views_from_document(json.dumps(node).encode(), "n.json", DRIVER)
    except pods.WorkloadError as exc:
        assert "\n" not in exc.message
        return
    for name in ("mig-pod.yaml", "gke-mig-pod.yaml", "dra.yaml", "amd-pod.yaml"):
        documents = pods.parse((CORPUS / name).read_bytes(), name)
        report = pods.check(documents, name, node=views, platform="auto")
        assert {r.status for w in report.workloads for r in w.results} <= {
            "pass", "warn", "fail", "skip"}
        json.loads(report.to_json())


@pytest.mark.parametrize("value", ["abc", float("nan"), "1e999999999", 10**40])
def test_a_gpu_with_a_bad_quantity_is_still_a_gpu(value: object) -> None:
    """An unreadable GPU count is a `whole` failure, never "uses no GPU"."""
    spec = {"containers": [{"name": "c", "image": "x",
                            "resources": {"limits": {"nvidia.com/gpu": value}}}]}
    documents = pods.Documents((pods.Workload(1, "Pod", "p", None, spec),), ())
    report = pods.check(documents, "p", node=pods.NodeView())
    found = verdicts(report)
    assert (found["limits"], found["whole"], found["gpu-count"]) == ("pass", "fail", "skip")
    assert not report.passed
