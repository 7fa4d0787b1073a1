"""check-pod as a user runs it: the real CLI in a subprocess with --strict,
--platform, a List of Nodes, custom resources' pod templates and DRA claims in the same file,
JSON with both severities, and the README's examples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "workloads" / "corpus"
DRIVER = "535.261.03"


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TERMINATION_LOG": str(tmp_path / "termination-log")}
    return subprocess.run([sys.executable, "-m", "installer", "check-pod", *args],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def corpus(name: str) -> str:
    return str(CORPUS / name)


class TestSeverities:
    def test_a_warning_exits_0_and_fails_with_strict(self, tmp_path: Path) -> None:
        done = run(tmp_path, corpus("mig-pod.yaml"), "--driver", DRIVER)
        assert done.returncode == 0, done.stderr
        assert "  WARN  toleration     does not tolerate the taint nvidia.com/gpu:NoSchedule" \
            in done.stdout
        assert done.stdout.splitlines()[-1] == "result: 0 rule(s) fail, 1 warn in 1 workload(s)"
        strict = run(tmp_path, corpus("mig-pod.yaml"), "--driver", DRIVER, "--strict")
        assert strict.returncode == 14
        assert strict.stderr.startswith("error(incompatible): 1 rule(s) fail or warn "
                                        "(--strict): Pod/mig-1g: toleration")

    def test_json_shows_both_severities_and_the_platform(self, tmp_path: Path) -> None:
        done = run(tmp_path, corpus("gpu-intent-no-request.yaml"), "--output", "json")
        assert done.returncode == 14
        report = json.loads(done.stdout)
        statuses = {r["rule"]: r["status"] for r in report["workloads"][0]["rules"]}
        assert (statuses["limits"], statuses["toleration"]) == ("fail", "warn")
        assert report["workloads"][0]["warnings"] == 1
        assert report["platform"] == {
            "name": "generic", "from": "no platform labels seen",
            "taint": "nvidia.com/gpu:NoSchedule", "admission_adds_tolerations": False,
            "text": report["platform"]["text"]}
        assert report["passed"] is False and report["strict"] is False

    def test_no_gpu_is_a_skip(self, tmp_path: Path) -> None:
        done = run(tmp_path, corpus("nic-driver-daemonset.yaml"))
        assert done.returncode == 0
        assert "  SKIP  gpu            uses no GPU" in done.stdout


class TestPlatform:
    @pytest.mark.parametrize(("platform", "status", "taint"), [
        ("gke", "pass", "nvidia.com/gpu=present:NoSchedule"),
        ("aks", "warn", "sku=gpu:NoSchedule"),
        ("eks", "warn", "nvidia.com/gpu:NoSchedule"),
        ("generic", "warn", "nvidia.com/gpu:NoSchedule"),
    ])
    def test_each_platforms_taint(self, tmp_path: Path, platform: str, status: str,
                                  taint: str) -> None:
        done = run(tmp_path, corpus("gke-l4-deployment.yaml"), "--platform", platform,
                   "--output", "json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        (toleration,) = [r for r in report["workloads"][0]["rules"]
                         if r["rule"] == "toleration"]
        assert toleration["status"] == status
        assert taint in toleration["why"]
        assert report["platform"]["from"] == "--platform"

    def test_auto_from_the_node(self, tmp_path: Path) -> None:
        done = run(tmp_path, corpus("karpenter-job.yaml"), "--node-labels",
                   corpus("node-eks-karpenter-a10g.yaml"), "--driver", DRIVER)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("platform: eks (from the node's labels): GPU nodes "
                                      "usually tainted nvidia.com/gpu:NoSchedule")

    def test_unknown_platform_exits_2(self, tmp_path: Path) -> None:
        done = run(tmp_path, corpus("aks-pod.yaml"), "--platform", "openshift")
        assert done.returncode == 2
        assert "openshift" in done.stderr


class TestNodes:
    def test_a_list_of_nodes_answers_which_fit(self, tmp_path: Path) -> None:
        done = run(tmp_path, corpus("two-gpu-job.yaml"), "--node-labels",
                   corpus("nodes-gke-mixed.yaml"), "--output", "json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["nodes"] == ["gke-ml-l4-pool-1a2b", "gke-ml-a100-pool-7c8d",
                                   "gke-ml-default-pool-0000"]
        assert report["fits"] == {"Job/ddp-2gpu spec.template": ["gke-ml-a100-pool-7c8d"]}
        assert [w["node"] for w in report["workloads"]] == report["nodes"]

    def test_fitting_no_node_exits_14(self, tmp_path: Path) -> None:
        done = run(tmp_path, corpus("mig-pod.yaml"), "--node-labels",
                   corpus("nodes-gke-mixed.yaml"))
        assert done.returncode == 14
        assert "fits: Pod/mig-1g -> no node" in done.stdout
        assert "1 workload(s) fit no node: Pod/mig-1g: fits no node" in done.stderr

    def test_a_list_of_other_things_exits_2(self, tmp_path: Path) -> None:
        nodes = tmp_path / "nodes.yaml"
        nodes.write_text("apiVersion: v1\nkind: List\nitems: [{kind: Pod}]\n")
        done = run(tmp_path, corpus("aks-pod.yaml"), "--node-labels", str(nodes))
        assert done.returncode == 2
        (line,) = done.stderr.splitlines()
        assert "is a List that holds more than Nodes" in line


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


def test_a_helm_template_beside_a_pod(tmp_path: Path) -> None:
    """An unrendered document is one problem line and hides no other (problem 7)."""
    source = tmp_path / "chart.yaml"
    source.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {{ .Values.name }}\n"
                      "spec:\n  containers: [{name: c, image: x}]\n---\n"
                      + (CORPUS / "nvidia-smoke-pod.yaml").read_text())
    done = run(tmp_path, str(source), "--output", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [w["name"] for w in report["workloads"]] == ["cuda-vectoradd"]
    (problem,) = report["problems"]
    assert "render it first (`helm template" in problem
    text = run(tmp_path, str(source)).stdout
    assert f"problem: {problem}" in text


def test_the_readme_examples(tmp_path: Path) -> None:
    """README.md's check-pod commands, run as written, print the output it shows."""
    repo = Path(__file__).resolve().parents[2]
    text = (repo / "README.md").read_text(encoding="utf-8")
    start = text.index("# tested: tests/cli/test_checkpod_cli.py::test_the_readme_examples\n")
    commands = text[start:text.index("```", start)].splitlines()[1:]
    shown_at = text.index("```\n", text.index("```", start) + 3) + 4
    shown = text[shown_at:text.index("```", shown_at)]
    env = {**os.environ, "TERMINATION_LOG": str(tmp_path / "termination-log"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    printed = "".join(subprocess.run(["bash", "-c", command], cwd=repo, env=env, timeout=120,
                                     capture_output=True, text=True, check=True).stdout
                      for command in commands)
    assert len(commands) == 2
    assert printed == shown
