"""check-pod on custom resources with pod templates and DRA claims in the same file (issue 28,
problems 3 and 4): the real CLI in a subprocess, each template judged by its path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "workloads" / "corpus"
DRIVER = "535.261.03"


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TERMINATION_LOG": str(tmp_path / "termination-log")}
    return subprocess.run([sys.executable, "-m", "installer", "check-pod", *args],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def corpus(name: str) -> str:
    return str(CORPUS / name)


class TestShapes:
    """Custom resources holding pod templates (read by workloads.py), judged per template."""

    def test_leaderworkerset_on_an_h100_node(self, tmp_path: Path) -> None:
        done = run(tmp_path, corpus("leaderworkerset.yaml"), "--node-labels",
                   corpus("node-operator-h100.yaml"), "--driver", DRIVER, "--output", "json")
        assert done.returncode == 0, done.stdout + done.stderr
        paths = {w["path"]: w["passed"] for w in json.loads(done.stdout)["workloads"]}
        assert paths == {"spec.leaderWorkerTemplate.leaderTemplate": True,
                         "spec.leaderWorkerTemplate.workerTemplate": True}

    def test_ray_worker_groups_and_cpu_heads(self, tmp_path: Path) -> None:
        done = run(tmp_path, corpus("raycluster.yaml"), "--node-labels",
                   corpus("node-gke-standard-l4.yaml"), "--output", "json")
        report = json.loads(done.stdout)
        found = {(w["kind"], w["path"]): {r["rule"]: r["status"] for r in w["rules"]}
                 for w in report["workloads"]}
        assert found[("RayCluster", "spec.headGroupSpec.template")] == {"gpu": "skip"}
        assert found[("RayCluster", "spec.workerGroupSpecs[0].template")]["gpu-count"] \
            == "pass"
        assert found[("RayService", "spec.rayClusterConfig.workerGroupSpecs[0].template")][
            "gpu-count"] == "fail"  # 2 GPUs per pod, the L4 node has 1
        assert found[("RayJob", "spec.rayClusterSpec.workerGroupSpecs[0].template")][
            "gpu-count"] == "pass"
        assert done.returncode == 14

    def test_pytorchjob_and_jobset(self, tmp_path: Path) -> None:
        done = run(tmp_path, corpus("pytorchjob.yaml"), "--output", "json")
        paths = [w["path"] for w in json.loads(done.stdout)["workloads"]]
        assert paths == ["spec.pytorchReplicaSpecs.Master.template",
                         "spec.pytorchReplicaSpecs.Worker.template"]
        done = run(tmp_path, corpus("jobset.yaml"), "--node-labels",
                   corpus("node-eks-karpenter-a10g.yaml"), "--output", "json")
        (worker,) = json.loads(done.stdout)["workloads"]
        rules = {r["rule"]: r["status"] for r in worker["rules"]}
        assert rules["gpu-count"] == "fail"  # 4 GPUs per pod, a g5.xlarge has 1
        assert done.returncode == 14

    def test_dra_claims_in_the_same_file(self, tmp_path: Path) -> None:
        done = run(tmp_path, corpus("dra-nic.yaml"), "--output", "json")
        assert done.returncode == 0, done.stderr
        (pod,) = json.loads(done.stdout)["workloads"]
        assert [r["status"] for r in pod["rules"]] == ["skip"]
