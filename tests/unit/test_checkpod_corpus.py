"""check-pod on the manifests people really write: each problem such a manifest has, as
tests over tests/workloads/corpus, each expected verdict asserted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from installer.compat import pods
from installer.compat.pods import PodReport
from installer.compat.pods.cuda import image_cuda
from installer.compat.pods.gpus import pod_totals

CORPUS = Path(__file__).resolve().parents[1] / "workloads" / "corpus"
DRIVER = "535.261.03"
ALL_PASS = {"limits": "pass", "requests": "pass", "whole": "pass", "toleration": "pass",
            "node-selector": "pass", "gpu-type": "pass", "gpu-count": "pass", "mig": "skip",
            "cuda": "pass"}
NO_NODE = {**ALL_PASS, "node-selector": "skip", "gpu-count": "skip"}


def judge(name: str, node: str | None = None, *, driver: str | None = DRIVER,
          platform: str = "auto", strict: bool = False) -> PodReport:
    documents = pods.parse((CORPUS / name).read_bytes(), name)
    if not documents.others:  # the judgement's own test: the claims the reader hands over
        claims = [d for d in yaml.safe_load_all((CORPUS / name).read_text())
                  if d.get("kind", "").startswith(("ResourceClaim", "DeviceClass"))]
        documents = replace(documents, others=tuple(claims))
    views = pods.node_views_from_document((CORPUS / node).read_bytes(), node, driver) \
        if node else (pods.NodeView(driver=driver),)
    return pods.check(documents, name, node=views, platform=platform, strict=strict)


def verdicts(report: PodReport, name: str | None = None, node: str = "") -> dict[str, str]:
    """rule -> status for the workload called `name` (the first one by default)."""
    found = [w for w in report.workloads if (name is None or w.workload.name == name)
             and w.node == node]
    return {r.rule: r.status for r in found[0].results}


def why(report: PodReport, rule: str, name: str | None = None, node: str = "") -> str:
    found = [w for w in report.workloads if (name is None or w.workload.name == name)
             and w.node == node]
    (result,) = [r for r in found[0].results if r.rule == rule]
    return f"{result.why} | fix: {result.fix}"


class TestProblem1GpuType:
    """No GPU-type selector is no failure; it is advice only where the nodes differ."""

    def test_nvidias_test_pod_passes_without_a_node(self) -> None:
        report = judge("nvidia-smoke-pod.yaml")
        assert verdicts(report) == NO_NODE
        assert report.passed

    def test_it_fits_a_given_node(self) -> None:
        report = judge("nvidia-smoke-pod.yaml", "node-operator-h100.yaml")
        assert verdicts(report) == ALL_PASS
        assert "on this node it gets nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3" in \
            why(report, "gpu-type")

    def test_warns_where_the_nodes_gpus_differ(self) -> None:
        report = judge("nvidia-smoke-pod.yaml", "nodes-gke-mixed.yaml")
        l4 = verdicts(report, node="gke-ml-l4-pool-1a2b")
        assert l4 == {**ALL_PASS, "gpu-type": "warn"}
        assert "nvidia-l4, nvidia-tesla-a100" in why(report, "gpu-type",
                                                        node="gke-ml-l4-pool-1a2b")
        assert "add nodeSelector: {cloud.google.com/gke-accelerator: nvidia-l4}" in \
            why(report, "gpu-type", node="gke-ml-l4-pool-1a2b")
        cpu = verdicts(report, node="gke-ml-default-pool-0000")
        assert (cpu["gpu-count"], cpu["gpu-type"]) == ("fail", "pass")  # no GPU: no advice
        assert report.fits() == {"Pod/cuda-vectoradd": ["gke-ml-l4-pool-1a2b",
                                                        "gke-ml-a100-pool-7c8d"]}
        assert report.passed
        strict = judge("nvidia-smoke-pod.yaml", "nodes-gke-mixed.yaml", strict=True)
        assert not strict.passed
        assert strict.failures() == ["Pod/cuda-vectoradd: fits no node"]


class TestProblem2Taints:
    """Each platform's own taint, and admission's toleration only where it is added."""

    def test_gke_sample_without_a_toleration(self) -> None:
        report = judge("gke-l4-deployment.yaml")
        assert report.platform.name == "gke"
        assert verdicts(report) == NO_NODE
        assert "gke's admission adds the toleration for nvidia.com/gpu=present:NoSchedule" \
            in why(report, "toleration")

    def test_gke_sample_on_its_node(self) -> None:
        report = judge("gke-l4-deployment.yaml", "node-gke-standard-l4.yaml")
        assert verdicts(report) == ALL_PASS
        assert report.platform.source == "the node's labels"

    def test_elsewhere_a_missing_toleration_is_a_warning(self) -> None:
        report = judge("gke-l4-deployment.yaml", platform="generic")
        assert verdicts(report)["toleration"] == "warn"
        assert report.passed

    def test_the_gpu_operator_does_not_taint(self) -> None:
        report = judge("gke-l4-deployment.yaml", "node-operator-h100.yaml")
        assert verdicts(report)["toleration"] == "pass"
        assert "no taints" in why(report, "toleration")

    def test_aks_pool_taint(self) -> None:
        report = judge("aks-pod.yaml", "node-aks-t4.yaml")
        assert report.platform.name == "aks"
        assert "sku=gpu:NoSchedule" in report.platform.describe()
        assert verdicts(report) == {**ALL_PASS, "cuda": "skip"}
        assert verdicts(judge("aks-pod.yaml", platform="aks"))["toleration"] == "pass"

    def test_a_gke_pod_on_an_aks_node(self) -> None:
        report = judge("gke-l4-deployment.yaml", "node-aks-t4.yaml")
        found = verdicts(report)
        assert (found["toleration"], found["node-selector"]) == ("fail", "fail")
        assert "does not tolerate the taint sku=gpu:NoSchedule of node " \
               "aks-gpunp-12345678-vmss000000" in why(report, "toleration")
        assert "add tolerations: [{key: sku, operator: Exists, effect: NoSchedule}]" in \
            why(report, "toleration")
        assert not report.passed

    def test_aks_without_a_node_names_its_taint(self) -> None:
        report = judge("nvidia-smoke-pod.yaml", platform="aks")
        assert verdicts(report)["toleration"] == "warn"
        assert "sku=gpu:NoSchedule" in why(report, "toleration")

    def test_eks_karpenter(self) -> None:
        report = judge("karpenter-job.yaml", "node-eks-karpenter-a10g.yaml")
        assert report.platform.name == "eks"
        assert verdicts(report) == ALL_PASS

    def test_gke_adds_no_toleration_for_mig_names(self) -> None:
        report = judge("mig-pod.yaml", platform="gke")
        assert verdicts(report)["toleration"] == "warn"
        assert "admission adds" not in why(report, "toleration")
        on_node = judge("mig-pod.yaml", "node-gke-autopilot-a100-mig.yaml")
        assert verdicts(on_node)["toleration"] == "fail"


class TestProblem4Dra:
    def test_a_claim_template_for_a_gpu(self) -> None:
        report = judge("dra.yaml")
        assert verdicts(report, "dra-template-pod") == {
            **NO_NODE, "toleration": "warn", "cuda": "pass"}
        assert "DRA claim gpu (ResourceClaimTemplate/single-gpu: device class " \
               "gpu.nvidia.com)" in why(report, "limits", "dra-template-pod")
        assert "CUDA from the image tag nvidia/cuda:12.8.0-base-ubuntu22.04" in \
            why(report, "cuda", "dra-template-pod")
        assert "DRA claims" in why(report, "gpu-count", "dra-template-pod")

    def test_a_named_claim_not_in_the_file(self) -> None:
        report = judge("dra.yaml")
        assert verdicts(report, "dra-shared-claim-pod")["limits"] == "pass"
        assert "ResourceClaim/team-gpu: not in this input, assumed a GPU" in \
            why(report, "limits", "dra-shared-claim-pod")

    def test_a_device_class_of_its_own_selecting_nvidias_driver(self) -> None:
        report = judge("dra.yaml")
        assert verdicts(report, "dra-own-class-pod")["limits"] == "pass"
        assert "DRA claim gpu (ResourceClaim/h100-claim: device class team-accelerators)" in \
            why(report, "limits", "dra-own-class-pod")

    def test_a_claim_for_a_nic_is_no_gpu(self) -> None:
        report = judge("dra-nic.yaml")
        assert verdicts(report) == {"gpu": "skip"}


class TestProblem5OtherGpus:
    def test_amd_is_a_gpu_with_a_note(self) -> None:
        report = judge("amd-pod.yaml")
        assert verdicts(report) == {**NO_NODE, "cuda": "skip"}
        assert "an AMD GPU: this installer drives NVIDIA's" in why(report, "limits")
        assert "not an NVIDIA GPU" in why(report, "cuda")
        assert "amd.com/gpu:NoSchedule" in why(report, "toleration")

    def test_amd_on_its_node_and_on_an_nvidia_node(self) -> None:
        assert verdicts(judge("amd-pod.yaml", "node-amd-mi300x.yaml")) == {
            **ALL_PASS, "cuda": "skip"}
        on_nvidia = judge("amd-pod.yaml", "node-operator-h100.yaml")
        assert verdicts(on_nvidia)["gpu-count"] == "fail"
        assert "asks for 1 amd.com/gpu, but this node's allocatable is 0" in \
            why(on_nvidia, "gpu-count")

    def test_mig_resource_on_a_mig_node(self) -> None:
        report = judge("mig-pod.yaml", "node-operator-a100-mig.yaml")
        assert verdicts(report) == {**ALL_PASS, "mig": "pass"}
        assert "1g.5gb (allocatable nvidia.com/mig-1g.5gb)" in why(report, "mig")

    def test_mig_resource_on_a_whole_gpu_node(self) -> None:
        report = judge("mig-pod.yaml", "node-operator-h100.yaml")
        found = verdicts(report)
        assert (found["mig"], found["gpu-count"]) == ("fail", "fail")
        assert "asks for MIG 1g.5gb, but this node offers no MIG slices" in why(report, "mig")

    def test_gke_partition_size(self) -> None:
        report = judge("gke-mig-pod.yaml", "node-gke-autopilot-a100-mig.yaml")
        assert verdicts(report) == {**ALL_PASS, "mig": "pass", "cuda": "pass"}
        wrong = judge("gke-mig-pod.yaml", "node-gke-standard-l4.yaml")
        assert verdicts(wrong)["mig"] == "fail"
        assert "nodeSelector cloud.google.com/gke-gpu-partition-size=1g.10gb, but this node " \
               "has no cloud.google.com/gke-gpu-partition-size label" in \
               why(wrong, "node-selector")
        assert "MIG 1g.10gb" in why(judge("gke-mig-pod.yaml"), "mig")

    def test_time_slicing(self) -> None:
        report = judge("time-slicing.yaml", "node-gke-standard-l4.yaml")
        assert verdicts(report, "shared-notebook")["gpu-count"] == "fail"  # no such resource
        assert verdicts(report, "shared-notebook")["limits"] == "pass"
        assert "cloud.google.com/gke-gpu-sharing-strategy=time-sharing, but this node has " \
               "no cloud.google.com/gke-gpu-sharing-strategy label" in \
               why(report, "node-selector", "gke-time-shared")


class TestProblem6Count:
    def test_two_gpus_on_a_one_gpu_node(self) -> None:
        report = judge("two-gpu-job.yaml", "node-gke-standard-l4.yaml")
        assert verdicts(report)["gpu-count"] == "fail"
        assert "asks for 2 nvidia.com/gpu, but this node's allocatable is 1" in \
            why(report, "gpu-count")
        assert verdicts(judge("two-gpu-job.yaml", "node-operator-h100.yaml"))["gpu-count"] \
            == "pass"

    def test_count_from_labels(self, tmp_path: Path) -> None:
        labels = tmp_path / "labels.yaml"
        labels.write_text("nvidia.com/gpu.count: '1'\n")
        views = pods.node_views_from_document(labels.read_bytes(), "labels.yaml", None)
        documents = pods.parse((CORPUS / "two-gpu-job.yaml").read_bytes(), "j")
        report = pods.check(documents, "j", node=views)
        assert "this node's label nvidia.com/gpu.count is 1" in why(report, "gpu-count")

    def test_init_containers_count_as_the_scheduler_does(self) -> None:
        spec = {"initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 3}}}],
                "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1}}},
                               {"name": "b", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
        assert pod_totals(spec) == {"nvidia.com/gpu": 3}
        spec["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1
        assert pod_totals(spec) == {"nvidia.com/gpu": 2}


class TestProblem7Messages:
    def test_every_selector_mismatch_is_named(self) -> None:
        report = judge("gke-spot-statefulset.yaml", "nodes-gke-mixed.yaml")
        a100 = "gke-ml-a100-pool-7c8d"
        assert verdicts(report, node=a100)["node-selector"] == "fail"
        assert verdicts(report, node=a100)["gpu-type"] == "pass"
        text = why(report, "node-selector", node=a100)
        assert "nodeSelector cloud.google.com/gke-accelerator=nvidia-l4, but this node has " \
               "cloud.google.com/gke-accelerator=nvidia-tesla-a100" in text
        assert "nodeSelector cloud.google.com/gke-spot=true, but this node has no " \
               "cloud.google.com/gke-spot label" in text
        assert "select cloud.google.com/gke-accelerator: nvidia-tesla-a100 (this node's)" in text
        assert report.fits() == {"StatefulSet/embedder spec.template (replicas 3)":
                                 ["gke-ml-l4-pool-1a2b"]}

    @pytest.mark.parametrize("key", [
        "karpenter.k8s.aws/instance-gpu-name", "node.kubernetes.io/instance-type",
        "kubernetes.azure.com/accelerator", "cloud.google.com/compute-class",
        "cloud.google.com/gke-accelerator", "nvidia.com/gpu.product"])
    def test_gpu_type_labels_of_every_platform(self, tmp_path: Path, key: str) -> None:
        pod = (CORPUS / "nvidia-smoke-pod.yaml").read_text().replace(
            "  tolerations:", f"  nodeSelector: {{{key}: x}}\n  tolerations:")
        path = tmp_path / "pod.yaml"
        path.write_text(pod)
        report = pods.check(pods.parse(path.read_bytes(), "p"), "p", node=pods.NodeView())
        assert why(report, "gpu-type") == f"selects the GPU type by {key} | fix: "


class TestProblem8NoGpu:
    def test_infrastructure_pods_are_skipped(self) -> None:
        report = judge("nic-driver-daemonset.yaml", "node-gke-standard-l4.yaml")
        assert verdicts(report) == {"gpu": "skip"}
        assert report.passed
        assert "nvidia.com/gpu: 1" not in report.to_text()
        assert "uses no GPU" in report.to_text()

    def test_gpu_intent_without_a_request_fails(self) -> None:
        report = judge("gpu-intent-no-request.yaml")
        assert verdicts(report)["limits"] == "fail"
        text = why(report, "limits")
        assert "container app sets NVIDIA_VISIBLE_DEVICES" in text
        assert "selects nodes by nvidia.com/gpu.product" in text
        assert "set resources.limits: {nvidia.com/gpu: 1}" in text


class TestProblem9Cuda:
    def test_versions_from_image_tags(self) -> None:
        report = judge("cuda-images.yaml")
        text = why(report, "cuda", "tagged")
        assert verdicts(report, "tagged")["cuda"] == "pass"
        for shown in ("container runtime: CUDA 12.4 Update 1", "container sample: CUDA 12.5",
                      "container torch: CUDA 12.1", "the image tag nvidia/cuda:12.4.1-"):
            assert shown in text

    def test_an_old_driver_fails(self) -> None:
        report = judge("cuda-images.yaml", driver="470.256.02")
        assert verdicts(report, "tagged")["cuda"] == "fail"

    def test_an_unknown_tag_is_skipped_not_guessed(self) -> None:
        report = judge("cuda-images.yaml")
        assert verdicts(report, "untagged")["cuda"] == "skip"
        assert "no CUDA version known" in why(report, "cuda", "untagged")

    @pytest.mark.parametrize(("image", "version"), [
        ("nvidia/cuda:12.4.1-runtime-ubuntu22.04", "12.4.1"),
        ("nvcr.io/nvidia/cuda:12.2.2-base-ubuntu22.04", "12.2.2"),
        ("localhost:5000/nvidia/cuda:11.8.0-devel", "11.8.0"),
        ("nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04", "12.5.0"),
        ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", "12.1"),
        ("rayproject/ray:2.9.0-py310-cu121", "12.1"),
        ("example/torch:2.1-cu118", "11.8"),
        ("example/vllm:cu130", "13.0"),
        ("nvcr.io/nvidia/pytorch:24.05-py3", None),
        ("vllm/vllm-openai:v0.8.5", None),
        ("nvidia/cuda@sha256:0123", None),
        ("localhost:5000/nvidia/cuda", None),
        ("example/app:cudnn9-runtime", None),
        ("example/docu121:1", None),
    ])
    def test_tag_patterns(self, image: str, version: str | None) -> None:
        assert image_cuda(image) == version


def test_a_machine_type_selector_shows_no_gpu_intent() -> None:
    """A CPU pod pinned to a machine type or compute class is no GPU pod (problem 8)."""
    spec = {"nodeSelector": {"node.kubernetes.io/instance-type": "e2-standard-4",
                             "cloud.google.com/compute-class": "Balanced"},
            "containers": [{"name": "web", "image": "nginx:1.27"}]}
    documents = pods.Documents((pods.Workload(1, "Pod", "web", None, spec),), ())
    report = pods.check(documents, "p", node=pods.NodeView())
    assert verdicts(report) == {"gpu": "skip"}


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.glob("*.yaml")))
def test_built_in_kinds_of_the_corpus_are_valid(name: str) -> None:
    """The corpus is what the API server would take: built-in kinds against the 1.33 schema
    (custom resources and resource.k8s.io/v1, new in 1.34, have no schema there)."""
    import kubernetes_validate

    checked = 0
    for document in yaml.safe_load_all((CORPUS / name).read_text()):
        items = document["items"] if document.get("kind") == "List" else [document]
        for item in items:
            if item["apiVersion"] in ("v1", "apps/v1", "batch/v1"):
                kubernetes_validate.validate(item, "1.33.0", strict=True)
                checked += 1
    assert checked or name in {"leaderworkerset.yaml", "raycluster.yaml", "pytorchjob.yaml",
                               "jobset.yaml"}


@pytest.mark.parametrize(("resource", "extra", "note"), [
    ("gpu.intel.com/i915", (), "an Intel GPU"),
    ("nvidia.com/gpu.shared", (), ""),
    ("example.com/fpga", ("example.com/fpga",), ""),
])
def test_other_gpu_resources_and_their_taints(resource: str, extra: tuple[str, ...],
                                              note: str) -> None:
    """Each vendor's resource is a GPU without flags (problem 5), with its own taint."""
    spec = {"containers": [{"name": "c", "image": "x", "resources": {"limits": {resource: 1}}}]}
    documents = pods.Documents((pods.Workload(1, "Pod", "p", None, spec),), ())
    report = pods.check(documents, "p", node=pods.NodeView(), resources=extra)
    assert verdicts(report)["limits"] == "pass"
    assert (note in why(report, "limits")) if note else "GPU:" not in why(report, "limits")
    taint = "nvidia.com/gpu:NoSchedule" if resource.startswith("nvidia.com/") else \
        f"{resource}:NoSchedule"
    assert f"does not tolerate the taint {taint} " in why(report, "toleration")
