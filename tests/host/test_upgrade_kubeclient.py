"""node.kube's client against the strict fake API server (tests/kubefake.py), and the fake's
own strictness: it refuses what a real API server would."""

from __future__ import annotations

import json
from pathlib import Path

import kubefake
import pytest
from host.test_upgrade import DS_UID, NODE, UID
from kubefake import Cluster, node_doc, pod_doc


class TestKubeClient:
    """node.kube's eviction and deletion outcomes, against the strict fake."""

    def test_evict_and_delete_outcomes(self, tmp_path: Path) -> None:
        from installer.node import kube

        directory = tmp_path / "sa"
        directory.mkdir()
        (directory / "token").write_text(kubefake.TOKEN)
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)},
                          pods={"default/a": pod_doc("a", UID, NODE),
                                "default/b": pod_doc("b", DS_UID, NODE, owner="DaemonSet"),
                                "default/c": pod_doc("c", "c" * 32, NODE)})
        cluster.evictions["default/a"] = [429, 500]
        with kubefake.serve(cluster) as url:
            api = kube.api_server(url, directory, {})
            assert api is not None
            assert kube.evict(api, "default", "a", UID, 5) == "refused"
            with pytest.raises(kube.KubeError) as caught:
                kube.evict(api, "default", "a", UID, None)
            assert caught.value.status == 500
            assert kube.evict(api, "default", "a", UID, None) == "evicted"
            assert kube.evict(api, "default", "a", UID, None) == "gone"
            assert kube.delete_pod(api, "default", "b", "another-uid", None) == "gone"
            assert "default/b" in cluster.pods  # a replaced pod of that name is spared
            assert kube.delete_pod(api, "default", "b", DS_UID, 0) == "deleted"
            assert [p["metadata"]["name"] for p in kube.pods_on_node(api, NODE)] == ["c"]
            assert kube.pods_on_node(api, "other-node") == []
        assert cluster.errors == []


class TestFakeIsStrict:
    """Guards the guard: the fake API server refuses what a real one would."""

    def _call(self, api: str, method: str, path: str, body: object,
              content_type: str = "application/json") -> int:
        import requests

        return requests.request(method, api + path, data=json.dumps(body), timeout=5,
                                headers={"Authorization": f"Bearer {kubefake.TOKEN}",
                                         "Content-Type": content_type}).status_code

    def test_misspelt_or_mistyped_bodies_are_422(self) -> None:
        cluster = Cluster(node_name=NODE, nodes={NODE: node_doc(NODE)},
                          pods={"default/a": pod_doc("a", UID, NODE)})
        with kubefake.serve(cluster) as api:
            eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                        "metadata": {"name": "a", "namespace": "default"},
                        "deleteOption": {"gracePeriodSeconds": 1}}
            assert self._call(api, "POST", "/api/v1/namespaces/default/pods/a/eviction",
                              eviction) == 422
            assert self._call(api, "PATCH", f"/api/v1/nodes/{NODE}",
                              {"spec": {"unschedulable": "yes"}},
                              "application/merge-patch+json") == 422
            assert self._call(api, "PATCH", f"/api/v1/nodes/{NODE}",
                              {"spec": {"unschedulable": True}}) == 415
            assert self._call(api, "DELETE", "/api/v1/namespaces/default/pods/a",
                              {"apiVersion": "v1", "kind": "DeleteOptions",
                               "gracePeriod": 3}) == 422
        assert len(cluster.errors) == 4
        assert "default/a" in cluster.pods and "unschedulable" not in cluster.node()["spec"]
