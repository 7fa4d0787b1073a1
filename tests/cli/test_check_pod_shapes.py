"""`check-pod` finds every pod template of the objects people write: each named by
its path, with the pod count its object asks for, for the built-in kinds, the common custom
resources (LeaderWorkerSet, JobSet, Ray, Kubeflow, KServe, Knative, NIMService, Argo) and any
other kind with a pod-template shape. The examples in tests/workloads/shapes/ are our own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from installer.cli import cli
from installer.compat.pods.workloads import read_documents

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
SHAPES = WORKLOADS / "shapes"
DRIVER = "535.261.03"

# file -> every template found: (document, kind, path, replicas, multiplicity)
EXPECTED: dict[str, list[tuple[int, str, str, int | None, str]]] = {
    "leaderworkerset.yaml": [
        (1, "LeaderWorkerSet", "spec.leaderWorkerTemplate.leaderTemplate", 2,
         "2 groups, 1 leader each"),
        (1, "LeaderWorkerSet", "spec.leaderWorkerTemplate.workerTemplate", 6,
         "2 groups x 3 workers"),
        (2, "LeaderWorkerSet", "spec.leaderWorkerTemplate.workerTemplate", 2,
         "1 group x 2 pods, leader included")],
    "jobset.yaml": [
        (1, "JobSet", "spec.replicatedJobs[0].template.spec.template", 1,
         "job coordinator: replicas 1"),
        (1, "JobSet", "spec.replicatedJobs[1].template.spec.template", 8,
         "job workers: replicas 2 x parallelism 4, completions 4")],
    "ray.yaml": [
        (1, "RayCluster", "spec.headGroupSpec.template", 1, "head"),
        (1, "RayCluster", "spec.workerGroupSpecs[0].template", 1, "group cpu: replicas 1"),
        (1, "RayCluster", "spec.workerGroupSpecs[1].template", 4,
         "group gpu: replicas 2, minReplicas 1, maxReplicas 4, numOfHosts 2"),
        (2, "RayService", "spec.rayClusterConfig.headGroupSpec.template", 1, "head"),
        (2, "RayService", "spec.rayClusterConfig.workerGroupSpecs[0].template", 3,
         "group gpu-workers: replicas 3"),
        (3, "RayJob", "spec.rayClusterSpec.headGroupSpec.template", 1, "head"),
        (3, "RayJob", "spec.rayClusterSpec.workerGroupSpecs[0].template", 2,
         "group gpu: minReplicas 2, maxReplicas 8"),
        (3, "RayJob", "spec.submitterPodTemplate", 1, "submitter")],
    "kubeflow.yaml": [
        (1, "PyTorchJob", "spec.pytorchReplicaSpecs.Master.template", 1, "replicas 1"),
        (1, "PyTorchJob", "spec.pytorchReplicaSpecs.Worker.template", 3, "replicas 3"),
        (2, "TFJob", "spec.tfReplicaSpecs.Chief.template", 1, "replicas 1"),
        (2, "TFJob", "spec.tfReplicaSpecs.Worker.template", 2, "replicas 2"),
        (3, "MPIJob", "spec.mpiReplicaSpecs.Launcher.template", 1, "replicas 1"),
        (3, "MPIJob", "spec.mpiReplicaSpecs.Worker.template", 4, "replicas 4")],
    "serving.yaml": [
        (1, "InferenceService", "spec.predictor", 1, "minReplicas 1, maxReplicas 3"),
        (1, "InferenceService", "spec.transformer", 1, ""),
        (2, "InferenceService", "spec.predictor", 1, ""),
        (2, "InferenceService", "spec.predictor.workerSpec", None,
         "pipelineParallelSize 2, tensorParallelSize 4"),
        (3, "Service", "spec.template", 1, "min-scale 1"),
        (4, "NIMService", "spec", 2, "replicas 2"),
        (5, "SeldonDeployment", "spec.predictors[0].componentSpecs[0]", 3, "replicas 3")],
    "argo.yaml": [
        (1, "Workflow", "spec.templates[1]", None, "template prep"),
        (1, "Workflow", "spec.templates[2]", None, "template train"),
        (2, "CronWorkflow", "spec.workflowSpec.templates[0]", None, "template eval")],
    "other-kinds.yaml": [
        (1, "Job", "spec.tasks[0].template", 4, "replicas 4"),
        (2, "GpuBenchmark", "spec.runner", 2, "parallelism 2")],
}


def check(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["check-pod", *args], input=stdin)


def found(path: Path) -> list[tuple[int, str, str, int | None, str]]:
    documents = read_documents(path.read_bytes(), str(path))
    assert documents.problems == ()
    return [(w.document, w.kind, w.path, w.replicas, w.multiplicity)
            for w in documents.workloads]


class TestKnownShapes:
    """Each template of each example, by path and pod count, in document order."""

    @pytest.mark.parametrize("name", sorted(EXPECTED))
    def test_every_template_is_found(self, name: str) -> None:
        assert found(SHAPES / name) == EXPECTED[name]

    @pytest.mark.parametrize("name", sorted(EXPECTED))
    def test_each_template_is_judged_under_its_title(self, name: str) -> None:
        """The report names each template by kind, object, path and multiplicity."""
        done = check(str(SHAPES / name), "--driver", DRIVER)
        assert done.exit_code in (0, 14), done.output
        titles = [line.removesuffix(":").rsplit(" (document ", 1)
                  for line in done.stdout.splitlines() if line.endswith("):")]
        documents = read_documents((SHAPES / name).read_bytes(), name)
        assert [(t, int(n.removesuffix(")"))) for t, n in titles] == [
            (w.title, w.document) for w in documents.workloads]
        assert "error(internal)" not in done.stderr

    def test_titles_read_as_paths(self) -> None:
        done = check(str(SHAPES / "leaderworkerset.yaml"))
        assert ("LeaderWorkerSet/serving/llm-405b spec.leaderWorkerTemplate.workerTemplate "
                "(2 groups x 3 workers) (document 1):") in done.stdout
        done = check(str(SHAPES / "ray.yaml"))
        assert ("RayCluster/ml/rc spec.workerGroupSpecs[1].template (group gpu: replicas 2, "
                "minReplicas 1, maxReplicas 4, numOfHosts 2) (document 1):") in done.stdout

    def test_kserve_builds_the_model_container(self) -> None:
        """KServe runs the model in `kserve-container`, with the predictor's scheduling."""
        (predictor, *_rest) = read_documents((SHAPES / "serving.yaml").read_bytes(),
                                             "s").workloads
        (container,) = predictor.spec["containers"]
        assert container["name"] == "kserve-container"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert "storageUri" not in container and "modelFormat" not in container
        assert predictor.spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
        assert "minReplicas" not in predictor.spec

    def test_nim_service_builds_its_container(self) -> None:
        nim = read_documents((SHAPES / "serving.yaml").read_bytes(), "s").workloads[5]
        assert nim.kind == "NIMService"
        assert nim.spec == {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "containers": [{"name": "llama-nim",
                            "image": "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3",
                            "resources": {"limits": {"nvidia.com/gpu": 1}}}]}

    def test_argo_pods_take_the_workflows_scheduling(self) -> None:
        prep, train, _eval = read_documents((SHAPES / "argo.yaml").read_bytes(),
                                            "a").workloads
        assert prep.spec["nodeSelector"] == {"cloud.google.com/gke-nodepool": "gpu-pool"}
        assert train.spec["nodeSelector"] == {"cloud.google.com/gke-nodepool": "gpu-pool",
                                              "cloud.google.com/gke-accelerator": "nvidia-l4"}
        assert train.spec["tolerations"] == prep.spec["tolerations"] != []
        assert [c["name"] for c in prep.spec["containers"]] == ["main"]
        assert "source" not in prep.spec["containers"][0]

    def test_unnamed_containers_of_a_custom_resource_are_named_by_place(self) -> None:
        knative = read_documents((SHAPES / "serving.yaml").read_bytes(), "s").workloads[4]
        assert knative.kind == "Service"
        assert [c["name"] for c in knative.spec["containers"]] == ["containers[0]"]

    def test_a_policy_is_not_a_workload(self) -> None:
        documents = read_documents((SHAPES / "other-kinds.yaml").read_bytes(), "o")
        assert documents.skipped == ("ClusterPolicy/require-gpu-limits",)
        assert [o["kind"] for o in documents.others] == ["ClusterPolicy"]


class TestBuiltInKinds:
    """Kubernetes' own kinds: path and the count the API server would use."""

    @pytest.mark.parametrize(("name", "title"), [
        ("pod.yaml", "Pod/cuda-vector-add"),
        ("deployment.yaml", "Deployment/ml/inference spec.template (replicas 2)"),
        ("statefulset.yaml", "StatefulSet/trainer spec.template (replicas 1)"),
        ("daemonset.yaml", "DaemonSet/dcgm-probe spec.template (one per node)"),
        ("job.json", "Job/benchmark spec.template"),
        ("cronjob.yaml", "CronJob/nightly-eval spec.jobTemplate.spec.template"),
    ])
    def test_title(self, name: str, title: str) -> None:
        (workload,) = read_documents((WORKLOADS / name).read_bytes(), name).workloads
        assert workload.title == title

    def test_counts_and_defaults(self, tmp_path: Path) -> None:
        pod = yaml.safe_load((WORKLOADS / "pod.yaml").read_text())
        template = {"spec": pod["spec"]}
        documents = [
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
             "spec": {"template": template}},
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
             "spec": {"parallelism": 4, "completions": 8, "template": template}},
            {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"},
             "spec": {"jobTemplate": {"spec": {"parallelism": 2, "template": template}}}},
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
             "template": template},
        ]
        text = yaml.safe_dump_all(documents).encode()
        assert [(w.path, w.replicas, w.multiplicity)
                for w in read_documents(text, "f").workloads] == [
            ("spec.template", 1, ""),
            ("spec.template", 4, "parallelism 4, completions 8"),
            ("spec.jobTemplate.spec.template", 2, "parallelism 2"),
            ("template", None, "")]


class TestGenericSearch:
    """Any other kind: PodSpec-shaped mappings, bounded however the YAML is built."""

    def test_a_template_used_twice_by_alias_is_found_twice(self) -> None:
        text = b"""
apiVersion: example.com/v1
kind: Pools
metadata: {name: p}
spec:
  a: {replicas: 2, template: &t {spec: {containers: [{name: c, image: x}]}}}
  b: {replicas: 5, template: *t}
"""
        assert [(w.path, w.replicas) for w in read_documents(text, "f").workloads] == [
            ("spec.a.template", 2), ("spec.b.template", 5)]

    def test_a_self_referencing_document_is_refused(self) -> None:
        text = b"apiVersion: example.com/v1\nkind: Loop\nmetadata: {name: l}\nspec: &s\n" \
               b"  again: *s\n  more: [*s, *s]\n"
        documents = read_documents(text, "f")  # refused by the bounded loader, not searched
        assert documents.workloads == () and documents.skipped == ()
        assert len(documents.problems) == 1
        assert documents.problems[0].startswith("f document 1: the alias *'s' is inside the "
                                                "node it names (a recursive document)")

    def test_a_billion_laughs_is_refused_within_bounds(self) -> None:
        levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
            f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
        text = ("apiVersion: example.com/v1\nkind: Laughs\nmetadata: {name: l}\nspec:\n"
                + "".join(f"  {line}\n" for line in levels)).encode()
        documents = read_documents(text, "f")  # refused before any object is built
        assert documents.workloads == () and documents.skipped == ()
        assert len(documents.problems) == 1
        assert "its aliases expand to more than 400000 nodes" in documents.problems[0]

    def test_status_and_metadata_are_not_searched(self) -> None:
        spec = {"containers": [{"name": "c", "image": "x"}]}
        document = {"apiVersion": "example.com/v1", "kind": "Thing",
                    "metadata": {"annotations": {"last": {"spec": spec}}},
                    "status": {"template": {"spec": spec}}}
        assert read_documents(yaml.safe_dump(document).encode(), "f").workloads == ()

    def test_an_empty_container_list_is_no_pod_template(self) -> None:
        document = {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"},
                    "spec": {"template": {"spec": {"containers": []}}}}
        assert read_documents(yaml.safe_dump(document).encode(), "f").skipped == ("Thing/t",)
