"""`check-pod` on fields of the wrong type: a PodSpec or a `--node-labels` Node that the
API server would reject for a field's type (an `image` that is a list, tolerations that are
lists, a `nodeSelector` that is a list, a number where a string must be) is exit 2 with one
line naming the document and the field, never a verdict (exit 0) on what is left of it.

Each case runs the real CLI sandboxed in an arena, its files inside the arena; each asserts
the exit code, the one line (the field's path and what it is instead) and that nothing in the
arena changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adversarial.harness import Arena, Result, assert_ok, assert_refused, assert_untouched

TIMEOUT = 20  # seconds per run: a hang is cut off; a loaded machine still finishes
GPU = "resources: {limits: {nvidia.com/gpu: 1}}"
GOOD_CONTAINER = f"{{name: c, image: nvidia/cuda:12.2.0-base-ubuntu22.04, {GPU}}}"


def pod(spec: str) -> str:
    return f"apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n{spec}\n"


def with_container(container: str, extra: str = "") -> str:
    return pod(f"  containers: [{container}]\n{extra}")


# (manifest, the field as the line names it, what it is instead)
WORKLOADS: dict[str, tuple[str, str, str]] = {
    "image a list": (with_container(f"{{name: c, image: [nvidia/cuda:12.2.0], {GPU}}}"),
                     "spec.containers[0].image", "is a list, not a string"),
    "image a mapping": (with_container(f"{{name: c, image: {{repo: cuda}}, {GPU}}}"),
                        "spec.containers[0].image", "is a mapping, not a string"),
    "image a number": (with_container(f"{{name: c, image: 12, {GPU}}}"),
                       "spec.containers[0].image", 'is the number 12, not a string'),
    "init container image a list": (
        pod(f"  initContainers: [{{name: i, image: [a]}}]\n  containers: [{GOOD_CONTAINER}]"),
        "spec.initContainers[0].image", "is a list, not a string"),
    "tolerations lists": (
        with_container(GOOD_CONTAINER, "  tolerations: [[{key: nvidia.com/gpu, "
                       "operator: Exists}]]"), "spec.tolerations[0]", "is a list, not a mapping"),
    "tolerations a mapping": (
        with_container(GOOD_CONTAINER, "  tolerations: {key: nvidia.com/gpu, operator: Exists}"),
        "spec.tolerations", "is a mapping, not a list"),
    "toleration operator misspelt": (
        with_container(GOOD_CONTAINER, "  tolerations: [{key: nvidia.com/gpu, operator: Exist}]"),
        "spec.tolerations[0].operator", "is 'Exist', which the API does not accept"),
    "toleration effect a list": (
        with_container(GOOD_CONTAINER, "  tolerations: [{operator: Exists, effect: [NoSchedule]}]"),
        "spec.tolerations[0].effect", "is a list, not a string"),
    "toleration value a boolean": (
        with_container(GOOD_CONTAINER, "  tolerations: [{key: gpu, value: true}]"),
        "spec.tolerations[0].value", "is the boolean true, not a string"),
    "tolerationSeconds a string": (
        with_container(GOOD_CONTAINER, "  tolerations: [{operator: Exists, effect: NoExecute, "
                       "tolerationSeconds: soon}]"),
        "spec.tolerations[0].tolerationSeconds", "is a string, not a whole number"),
    "containers a mapping": (pod(f"  containers: {GOOD_CONTAINER}"),
                             "spec.containers", "is a mapping, not a list"),
    "resources a list": (with_container("{name: c, image: i, resources: [1]}"),
                         "spec.containers[0].resources", "is a list, not a mapping"),
    "limits a list": (with_container("{name: c, image: i, resources: {limits: [nvidia.com/gpu]}}"),
                      "spec.containers[0].resources.limits", "is a list, not a mapping"),
    "requests a string": (with_container("{name: c, image: i, resources: {requests: gpu}}"),
                          "spec.containers[0].resources.requests", "is a string, not a mapping"),
    "a quantity a list": (
        with_container("{name: c, image: i, resources: {limits: {memory: [1Gi]}}}"),
        "spec.containers[0].resources.limits[memory]", "is a list, not a quantity"),
    "env a mapping": (with_container(f"{{name: c, image: i, env: {{CUDA_VERSION: '12.2'}}, "
                                     f"{GPU}}}"),
                      "spec.containers[0].env", "is a mapping, not a list"),
    "env value a number": (with_container(f"{{name: c, image: i, env: [{{name: CUDA_VERSION, "
                                          f"value: 12.2}}], {GPU}}}"),
                           "spec.containers[0].env[0].value", "is the number 12.2, not a string"),
    "nodeSelector a list": (with_container(GOOD_CONTAINER, "  nodeSelector: [gpu, a100]"),
                            "spec.nodeSelector", "is a list, not a mapping"),
    "nodeSelector value a number": (
        with_container(GOOD_CONTAINER, "  nodeSelector: {cloud.google.com/gke-accelerator-"
                       "count: 1}"),
        "spec.nodeSelector[cloud.google.com/gke-accelerator-count]",
        "is the number 1, not a string"),
    "affinity a list": (with_container(GOOD_CONTAINER, "  affinity: [nodeAffinity]"),
                        "spec.affinity", "is a list, not a mapping"),
    "nodeSelectorTerms a mapping": (
        with_container(GOOD_CONTAINER, "  affinity: {nodeAffinity: {requiredDuringScheduling"
                       "IgnoredDuringExecution: {nodeSelectorTerms: {matchExpressions: []}}}}"),
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
        "nodeSelectorTerms", "is a mapping, not a list"),
    "expression values a string": (
        with_container(GOOD_CONTAINER, "  affinity: {nodeAffinity: {requiredDuringScheduling"
                       "IgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: "
                       "gpu, operator: In, values: a100}]}]}}}"),
        "nodeSelectorTerms[0].matchExpressions[0].values", "is a string, not a list"),
    "resourceClaims a mapping": (with_container(GOOD_CONTAINER, "  resourceClaims: {name: g}"),
                                 "spec.resourceClaims", "is a mapping, not a list"),
    "a Deployment's image a list": (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {template: {spec: "
        f"{{containers: [{{name: c, image: [cuda], {GPU}}}]}}}}}}\n",
        "(Deployment) in spec.template: containers[0].image", "is a list, not a string"),
}


def _check_pod(arena: Arena, *args: str) -> Result:
    return arena.run("check-pod", *args, "--platform", "gke", "--driver", "535.261.03",
                     timeout=TIMEOUT)


def _write(arena: Arena, name: str, text: str) -> Path:
    path = arena.scene.work / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", WORKLOADS)
def test_a_workload_field_of_the_wrong_type_is_exit_2(arena: Arena, case: str) -> None:
    manifest, field, why = WORKLOADS[case]
    path = _write(arena, "workload.yaml", manifest)
    before = arena.snapshot()
    done = _check_pod(arena, str(path))
    assert_refused(done, 2, "error(config): ", f"{path} document 1", f"{field} {why}", "fix: ")
    assert done.stdout == ""
    assert_untouched(before, arena.snapshot())


def test_the_same_workload_well_typed_passes(arena: Arena) -> None:
    """The cases above differ from a passing pod only in the field they name."""
    path = _write(arena, "workload.yaml", with_container(
        GOOD_CONTAINER, "  tolerations: [{key: nvidia.com/gpu, operator: Exists}, "
        "{key: x, operator: '', effect: '', value: y}]\n"
        "  nodeSelector: {cloud.google.com/gke-accelerator-count: '1'}"))
    assert_ok(_check_pod(arena, str(path)))


def node(body: str) -> str:
    return f"apiVersion: v1\nkind: Node\n{body}\n"


LABELS = "metadata: {name: gpu-1, labels: {cloud.google.com/gke-accelerator: nvidia-l4}}"
NODES: dict[str, tuple[str, str, str]] = {
    "labels a list": (node("metadata: {name: gpu-1, labels: [nvidia-l4]}"),
                      "metadata.labels", "is a list, not a mapping"),
    "a label value a list": (node("metadata: {name: gpu-1, labels: {gpu: [l4]}}"),
                             "metadata.labels[gpu]", "is a list, not a string"),
    "taints a mapping": (node(f"{LABELS}\nspec: {{taints: {{key: nvidia.com/gpu, "
                              "effect: NoSchedule}}"),
                         "spec.taints", "is a mapping, not a list"),
    "taints lists": (node(f"{LABELS}\nspec: {{taints: [[nvidia.com/gpu, NoSchedule]]}}"),
                     "spec.taints[0]", "is a list, not a mapping"),
    "taint effect misspelt": (node(f"{LABELS}\nspec: {{taints: [{{key: nvidia.com/gpu, "
                                   "effect: NoSchedul}]}"),
                              "spec.taints[0].effect", "is 'NoSchedul', which the API does not"),
    "allocatable a list": (node(f"{LABELS}\nstatus: {{allocatable: [nvidia.com/gpu]}}"),
                           "status.allocatable", "is a list, not a mapping"),
    "an allocatable quantity a mapping": (
        node(f"{LABELS}\nstatus: {{allocatable: {{nvidia.com/gpu: {{count: 1}}}}}}"),
        "status.allocatable[nvidia.com/gpu]", "is a mapping, not a quantity"),
    "the second Node of a List": (
        "apiVersion: v1\nkind: List\nitems:\n- " + node(LABELS).rstrip().replace("\n", "\n  ")
        + "\n- apiVersion: v1\n  kind: Node\n  metadata: {name: gpu-2}\n  spec: {taints: "
        "{key: k}}\n", "Node gpu-2: spec.taints", "is a mapping, not a list"),
}


@pytest.mark.parametrize("case", NODES)
def test_a_node_field_of_the_wrong_type_is_exit_2(arena: Arena, case: str) -> None:
    document, field, why = NODES[case]
    workload = _write(arena, "workload.yaml", with_container(GOOD_CONTAINER))
    labels = _write(arena, "node.yaml", document)
    before = arena.snapshot()
    done = _check_pod(arena, str(workload), "--node-labels", str(labels))
    assert_refused(done, 2, "error(config): ", f"--node-labels {labels}", f"{field} {why}",
                   "fix: ")
    assert_untouched(before, arena.snapshot())


def test_an_oversize_node_file_gets_the_node_files_fix(arena: Arena) -> None:
    workload = _write(arena, "workload.yaml", with_container(GOOD_CONTAINER))
    labels = _write(arena, "node.yaml", node(LABELS) + "#" * (5 * 1024 * 1024) + "\n")
    before = arena.snapshot()
    done = _check_pod(arena, str(workload), "--node-labels", str(labels))
    assert_refused(done, 2, f"{labels} is larger than 4 MiB",
                   "fix: give --node-labels `kubectl get node NAME -o yaml`")
    assert "workload's own manifest" not in done.stderr
    assert_untouched(before, arena.snapshot())
