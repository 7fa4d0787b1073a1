"""Wait for Jobs (UPGRADE_WAIT_FOR_JOBS): after the cordon and before the eviction step,
the pods the selector picks on the node are waited for, not evicted, while Running or
Pending (state label wait-for-jobs-required, Events); UPGRADE_WAIT_FOR_JOBS_TIMEOUT ends
the wait and the eviction step goes on with them. As k8s-operator-libs'
pkg/upgrade/base/pod_manager.go (ScheduleCheckOnPodCompletion, commit 110a5208).

Same scene as tests/host/test_upgrade.py (a node serving V1 over the simulated kernel, a
mirror with V1 and V2, the strict fake API server); its helpers are imported from there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import kubefake
from e2e import Scene
from host import test_upgrade as shared
from host.test_upgrade import UID, V2, cluster_with, kernel, loaded, pod_cgroup, upgrade
from hypothesis import given, settings
from hypothesis import strategies as st
from kubefake import Cluster, pod_doc

repo, scene = shared.repo, shared.scene

JOB_UID = "3b5c3d8e-2f0b-4f54-9b7e-6c1a5a1b2c3d"
WAIT = "wait-for-jobs-required"


def job_pod() -> dict[str, object]:
    doc = pod_doc("job-1", JOB_UID, shared.NODE, owner="Job")
    doc["metadata"]["labels"] = {"app": "batch"}  # type: ignore[index]
    return doc


def busy_node(node: Scene) -> tuple[Cluster, int]:
    """A Job's pod and a training pod, each with a process holding the GPU."""
    job = kernel(node).open_device("nvidia", "/dev/nvidia0", "python3", pod_cgroup(JOB_UID))
    train = kernel(node).open_device("nvidia", "/dev/nvidia0", "python3", pod_cgroup(UID))
    cluster = cluster_with(node, job_pod(), pod_doc("train", UID, shared.NODE),
                           holders={"train": train, "job-1": job})
    return cluster, job


def when_waiting(cluster: Cluster, then: Callable[[], None]) -> threading.Thread:
    """Run `then` one second after the node is labelled wait-for-jobs-required."""
    def watch() -> None:
        end = time.monotonic() + 90
        while WAIT not in cluster.states() and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(1.0)
        then()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def evictions(cluster: Cluster) -> list[tuple[str, float]]:
    return [(c.path.split("/")[-2], c.at) for c in cluster.calls
            if c.path.endswith("/eviction")]


def reasons(cluster: Cluster) -> list[str]:
    return [e["reason"] for e in cluster.events]


class TestWaitForJobs:
    def test_a_selected_job_finishes_before_the_eviction_and_is_not_evicted(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster, job = busy_node(node)
        finished: list[float] = []

        def job_finishes() -> None:  # kubelet: the Job's container exits 0
            with cluster.lock:
                cluster.pods["default/job-1"]["status"]["phase"] = "Succeeded"
                finished.append(time.monotonic())
            kernel(node).close_device(job)

        with kubefake.serve(cluster) as api:
            watcher = when_waiting(cluster, job_finishes)
            done = upgrade(node, mirror, api, "--upgrade-wait-for-jobs", "app=batch",
                           "--upgrade-timeout", "30")
            watcher.join(5)
        assert done.returncode == 0, done.stderr[-3000:]
        assert cluster.errors == []
        assert cluster.states() == ["upgrade-required", "cordon-required", WAIT,
                                    "pod-deletion-required", "validation-required",
                                    "uncordon-required", "upgrade-done"]
        evicted = evictions(cluster)
        assert [name for name, _ in evicted] == ["train"]  # the Job's pod was never evicted
        assert finished and all(at > finished[0] for _, at in evicted)
        assert cluster.pods["default/job-1"]["status"]["phase"] == "Succeeded"
        assert reasons(cluster).index("DriverUpgradeWaitingForJobs") < reasons(
            cluster).index("DriverUpgradeJobsDone") < reasons(cluster).index(
            "DriverUpgradeEvicted")
        waiting = next(e for e in cluster.events
                       if e["reason"] == "DriverUpgradeWaitingForJobs")
        assert "default/job-1" in waiting["message"] and "app=batch" in waiting["message"]
        assert loaded(node) == V2

    def test_the_timeout_ends_the_wait_and_the_job_is_then_evicted(
            self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster, _job = busy_node(node)
        seen: list[float] = []
        with kubefake.serve(cluster) as api:
            watcher = when_waiting(cluster, lambda: seen.append(time.monotonic() - 1.0))
            done = upgrade(node, mirror, api, "--upgrade-wait-for-jobs",
                           "app in (batch, etl),tier notin (web)",
                           "--upgrade-wait-for-jobs-timeout", "2",
                           "--upgrade-timeout", "30")
            watcher.join(5)
        assert done.returncode == 0, done.stderr[-3000:]
        assert cluster.errors == []
        assert WAIT in cluster.states()
        assert "DriverUpgradeJobsTimeout" in reasons(cluster)
        waiting = next(e for e in cluster.events
                       if e["reason"] == "DriverUpgradeWaitingForJobs")  # set-based terms
        assert "app in (batch,etl),tier notin (web)" in waiting["message"]
        assert "default/job-1" in waiting["message"]
        assert "DriverUpgradeJobsDone" not in reasons(cluster)
        evicted = dict(evictions(cluster))
        assert set(evicted) == {"train", "job-1"}
        waited_from = next(c.at for c in cluster.calls if c.state == WAIT)
        assert min(evicted.values()) - waited_from >= 2.0  # the timeout, not sooner
        assert loaded(node) == V2

    def test_no_selected_pod_running_goes_straight_on(self, scene: tuple[Scene, str]) -> None:
        node, mirror = scene
        cluster, _job = busy_node(node)
        with kubefake.serve(cluster) as api:
            done = upgrade(node, mirror, api, "--upgrade-wait-for-jobs", "app=nightly",
                           "--upgrade-timeout", "30")
        assert done.returncode == 0, done.stderr[-3000:]
        assert WAIT in cluster.states()
        assert "DriverUpgradeWaitingForJobs" not in reasons(cluster)
        assert {name for name, _ in evictions(cluster)} == {"train", "job-1"}


class TestSelector:
    """The selector's terms against a pod's labels and phase (no node needed)."""

    def test_terms_and_phases(self) -> None:
        from installer.config.upgrade import pod_selector
        from installer.upgrade.jobs import running

        def pod(name: str, labels: dict[str, str], phase: str) -> dict[str, object]:
            return {"metadata": {"name": name, "namespace": "ml", "labels": labels},
                    "status": {"phase": phase}}

        pods = [pod("a", {"app": "batch"}, "Running"), pod("b", {"app": "batch"}, "Pending"),
                pod("c", {"app": "batch"}, "Succeeded"), pod("d", {"app": "batch"}, "Failed"),
                pod("e", {"app": "web"}, "Running"),
                pod("f", {"app": "batch", "spot": "y"}, "Running")]
        assert running(pods, pod_selector("app=batch")) == ["ml/a", "ml/b", "ml/f"]
        assert running(pods, pod_selector("app=batch,!spot")) == ["ml/a", "ml/b"]
        assert running(pods, pod_selector("app!=batch")) == ["ml/e"]
        assert running(pods, pod_selector("spot")) == ["ml/f"]
        assert running(pods, pod_selector("app==web")) == ["ml/e"]
        assert running([{"metadata": None, "status": "x"}], pod_selector("app")) == []

    def test_set_based_terms_as_the_api_server_matches_them(self) -> None:
        """apimachinery pkg/labels/selector.go (Requirement.Matches @ eed236ce): `in`
        needs the key, `notin` and `!=` hold without it, `<`/`>` compare integers only."""
        from installer.config.upgrade import pod_selector
        from installer.upgrade.jobs import matches, selector_text

        def picks(selector: str, labels: dict[str, str]) -> bool:
            return matches(pod_selector(selector), labels)

        assert picks("app in (batch, etl)", {"app": "etl"})
        assert not picks("app in (batch,etl)", {"app": "web"})
        assert not picks("app in (batch,etl)", {})
        assert picks("app notin (web)", {}) and picks("app notin (web)", {"app": "x"})
        assert not picks("app notin (web,db)", {"app": "db"})
        assert picks("app in (batch),tier notin (prod),!spot", {"app": "batch"})
        assert not picks("app in (batch),tier notin (prod)", {"app": "batch", "tier": "prod"})
        assert picks("app in ()", {"app": ""}) and not picks("app in ()", {"app": "a"})
        assert picks("gpus>2", {"gpus": "3"}) and not picks("gpus>2", {"gpus": "2"})
        assert picks("gpus<2", {"gpus": "-1"}) and not picks("gpus<2", {"gpus": "x"})
        assert not picks("gpus<2", {})
        assert pod_selector("app notin(b,a) , x") == (("app", "notin", ("a", "b")),
                                                      ("x", "exists", ()))
        assert selector_text(pod_selector("app in (b,a),k==v,!s,n>1")) == \
            "app in (a,b),k=v,!s,n>1"

    @settings(max_examples=400, deadline=None)
    @given(st.text(alphabet="ab/.-_=!,() <>+0123456789inotx", max_size=40))
    def test_any_text_is_refused_cleanly_or_reads_back_the_same(self, text: str) -> None:
        from installer.config.upgrade import pod_selector
        from installer.config.values import Invalid
        from installer.upgrade.jobs import matches, selector_text

        try:
            terms = pod_selector(text)
        except Invalid:
            return
        assert pod_selector(selector_text(terms)) == terms
        assert matches(terms, {"a": "1", "b": "x"}) in (True, False)
