"""`gpu-node-installer check-pod`: every workload kind, each rule passing and failing,
multi-document files, node labels, exit codes and one-line refusals of bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner, Result

from installer.cli import cli

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
EXAMPLES = ("pod.yaml", "deployment.yaml", "statefulset.yaml", "daemonset.yaml", "job.json",
            "cronjob.yaml", "multi.yaml")
DRIVER = "535.261.03"
GPU = "nvidia.com/gpu"


@pytest.fixture(autouse=True)
def _termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Failures also go to the termination log: keep it out of the CI host's /dev."""
    monkeypatch.setenv("TERMINATION_LOG", str(tmp_path / "termination-log"))


def check(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["check-pod", *args], input=stdin)


def rules(result: Result) -> dict[str, str]:
    """rule -> status of the first workload in a JSON report."""
    report = json.loads(result.stdout)
    return {r["rule"]: r["status"] for r in report["workloads"][0]["rules"]}


def base_pod() -> dict[str, Any]:
    return yaml.safe_load((WORKLOADS / "pod.yaml").read_text())


def write(tmp_path: Path, document: dict[str, Any], *, valid: bool = True) -> str:
    """The document as a file; `valid` ones are checked against the schema first."""
    if valid:
        kubernetes_validate.validate(document, "1.33.0", strict=True)
    path = tmp_path / "w.json"
    path.write_text(json.dumps(document))
    return str(path)


def container(document: dict[str, Any]) -> dict[str, Any]:
    return document["spec"]["containers"][0]


class TestExamples:
    @pytest.mark.parametrize("name", [*EXAMPLES, "node-l4.yaml"])
    @pytest.mark.parametrize("version", ["1.28.0", "1.33.0"])
    def test_valid_against_the_kubernetes_schema(self, name: str, version: str) -> None:
        for document in yaml.safe_load_all((WORKLOADS / name).read_text()):
            kubernetes_validate.validate(document, version, strict=True)

    @pytest.mark.parametrize("name", [n for n in EXAMPLES if n != "multi.yaml"])
    def test_every_kind_passes(self, name: str) -> None:
        done = check(str(WORKLOADS / name), "--driver", DRIVER, "--output", "json")
        assert done.exit_code == 0, done.output
        report = json.loads(done.stdout)
        (workload,) = report["workloads"]
        assert workload["passed"] is True
        assert [r["rule"] for r in workload["rules"]] == [
            "limits", "requests", "whole", "toleration", "node-selector", "gpu-type",
            "gpu-count", "mig", "cuda"]

    def test_kinds_are_named(self) -> None:
        kinds = {json.loads(check(str(WORKLOADS / n), "--output", "json").stdout)
                 ["workloads"][0]["kind"] for n in EXAMPLES if n != "multi.yaml"}
        assert kinds == {"Pod", "Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}

    def test_gke_admission_adds_the_toleration(self) -> None:
        done = check(str(WORKLOADS / "daemonset.yaml"), "--output", "json")
        (toleration,) = [r for r in json.loads(done.stdout)["workloads"][0]["rules"]
                         if r["rule"] == "toleration"]
        assert toleration["status"] == "pass"
        assert "gke's admission adds the toleration for nvidia.com/gpu=present:NoSchedule" \
            in toleration["why"]
        assert json.loads(done.stdout)["platform"]["name"] == "gke"

    def test_multi_document_file(self) -> None:
        done = check(str(WORKLOADS / "multi.yaml"), "--driver", DRIVER, "--output", "json")
        assert done.exit_code == 14
        report = json.loads(done.stdout)
        assert report["skipped"] == ["Service/inference"]
        ok, broken = report["workloads"]
        assert (ok["kind"], ok["name"], ok["document"], ok["passed"]) == ("Job", "ok", 2, True)
        assert (broken["name"], broken["document"], broken["passed"]) == ("broken", 3, False)
        failed = [r["rule"] for r in broken["rules"] if r["status"] == "fail"]
        assert failed == ["limits", "requests"]
        assert "error(incompatible): 2 rule(s) fail: Pod/broken: limits, Pod/broken: requests" \
            in done.stderr

    def test_stdin_and_a_list(self) -> None:
        pod = base_pod()
        listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": [pod, pod]})
        done = check("-", "--output", "json", stdin=listed)
        assert done.exit_code == 0, done.output
        assert len(json.loads(done.stdout)["workloads"]) == 2


class TestResources:
    def test_no_limits(self, tmp_path: Path) -> None:
        pod = base_pod()
        container(pod)["resources"] = {"limits": {"cpu": "1"}}
        done = check(write(tmp_path, pod), "--output", "json")
        assert done.exit_code == 14
        assert rules(done)["limits"] == "fail"

    @pytest.mark.parametrize(("requests", "limits", "status"), [
        ({GPU: 1}, {GPU: 1}, "pass"),
        ({GPU: "1"}, {GPU: 1}, "pass"),
        ({GPU: "2"}, {GPU: 1}, "fail"),
        ({GPU: 1}, {}, "fail"),
    ])
    def test_requests_equal_limits(self, tmp_path: Path, requests: dict[str, Any],
                                   limits: dict[str, Any], status: str) -> None:
        pod = base_pod()
        container(pod)["resources"] = {"requests": requests, "limits": limits}
        done = check(write(tmp_path, pod), "--output", "json")
        assert rules(done)["requests"] == status
        assert done.exit_code == (0 if status == "pass" else 14)

    @pytest.mark.parametrize(("value", "status"), [
        (1, "pass"), ("4", "pass"), ("1k", "pass"), ("2000m", "pass"),
        (0.5, "fail"), ("500m", "fail"), ("1.5", "fail"), ("1Ki", "pass")])
    def test_whole_gpus_only(self, tmp_path: Path, value: Any, status: str) -> None:
        pod = base_pod()
        container(pod)["resources"] = {"limits": {GPU: value}}
        done = check(write(tmp_path, pod), "--output", "json")
        assert rules(done)["whole"] == status, done.stdout

    def test_other_resources_by_name(self, tmp_path: Path) -> None:
        pod = base_pod()
        container(pod)["resources"] = {"limits": {"nvidia.com/mig-1g.5gb": "500m"}}
        path = write(tmp_path, pod)
        done = check(path, "--output", "json")  # MIG resources are known without --resource
        assert rules(done) == {"limits": "pass", "requests": "pass", "whole": "fail",
                               "toleration": "pass", "node-selector": "skip",
                               "gpu-type": "pass", "gpu-count": "skip", "mig": "skip",
                               "cuda": "skip"}
        assert "nvidia.com/mig-1g.5gb limit '500m' is not a whole number" in done.stdout


class TestScheduling:
    def test_no_toleration(self, tmp_path: Path) -> None:
        pod = base_pod()
        del pod["spec"]["tolerations"]
        done = check(write(tmp_path, pod))
        assert done.exit_code == 0, done.output  # no Node given: the usual taint is advice
        assert "WARN  toleration     does not tolerate the taint nvidia.com/gpu:NoSchedule " \
               "of GPU nodes (generic: the usual taint; no Node given)" in done.stdout
        assert check(write(tmp_path, pod), "--strict").exit_code == 14

    def test_wrong_effect(self, tmp_path: Path) -> None:
        pod = base_pod()
        pod["spec"]["tolerations"][0]["effect"] = "NoExecute"
        assert rules(check(write(tmp_path, pod), "--output", "json"))["toleration"] == "warn"

    def test_the_nodes_own_taints(self, tmp_path: Path) -> None:
        node = yaml.safe_load((WORKLOADS / "node-l4.yaml").read_text())
        node["spec"]["taints"].append({"key": "dedicated", "value": "ml",
                                       "effect": "NoSchedule"})
        labels = tmp_path / "node.yaml"
        labels.write_text(yaml.safe_dump(node))
        done = check(str(WORKLOADS / "pod.yaml"), "--node-labels", str(labels))
        assert done.exit_code == 14
        assert "FAIL  toleration     does not tolerate the taint dedicated=ml:NoSchedule of " \
               "node gpu-1" in done.stdout
        assert "add tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]" \
            in done.stdout

    def test_no_gpu_type(self, tmp_path: Path) -> None:
        pod = base_pod()
        pod["spec"]["nodeSelector"] = {"kubernetes.io/os": "linux"}
        done = check(write(tmp_path, pod))
        assert done.exit_code == 0, done.output  # no GPU type asked for: any GPU node, no failure
        assert "PASS  gpu-type       selects no GPU type: any GPU node will do" in done.stdout

    @pytest.mark.parametrize(("name", "status"), [
        ("pod.yaml", "pass"), ("deployment.yaml", "pass"), ("statefulset.yaml", "fail"),
        ("cronjob.yaml", "pass")])
    def test_against_the_nodes_labels(self, name: str, status: str) -> None:
        done = check(str(WORKLOADS / name), "--node-labels", str(WORKLOADS / "node-l4.yaml"),
                     "--output", "json")
        assert rules(done)["node-selector"] == status, done.stdout
        assert rules(done)["gpu-type"] == "pass"

    @pytest.mark.parametrize(("expression", "status"), [
        ({"key": "gpu-node-installer/gpu.memory", "operator": "Gt", "values": ["16000"]},
         "pass"),
        ({"key": "gpu-node-installer/gpu.memory", "operator": "Gt", "values": ["40000"]},
         "fail"),
        ({"key": "gpu-node-installer/gpu.product", "operator": "NotIn",
          "values": ["NVIDIA-L4"]}, "fail"),
        ({"key": "gpu-node-installer/gpu.family", "operator": "Exists"}, "pass"),
    ])
    def test_node_affinity(self, tmp_path: Path, expression: dict[str, Any],
                           status: str) -> None:
        pod = base_pod()
        del pod["spec"]["nodeSelector"]
        pod["spec"]["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expression]}]}}}
        labels = {"gpu-node-installer/gpu.product": "NVIDIA-L4",
                  "gpu-node-installer/gpu.family": "ada-lovelace",
                  "gpu-node-installer/gpu.memory": "23034"}
        label_file = tmp_path / "labels.json"
        label_file.write_text(json.dumps(labels))
        done = check(write(tmp_path, pod), "--node-labels", str(label_file), "--output", "json")
        assert rules(done)["node-selector"] == status, done.stdout


class TestCuda:
    @pytest.mark.parametrize(("args", "status"), [
        (("--driver", DRIVER), "pass"),                       # CUDA_VERSION 12.2.0
        (("--driver", "470.256.02"), "fail"),
        (("--driver", DRIVER, "--cuda", "13.0"), "fail"),
        (("--driver", DRIVER, "--cuda", "12.8"), "pass"),     # minor version compatibility
        ((), "skip"),                                         # no driver known
    ])
    def test_toolkit_against_driver(self, args: tuple[str, ...], status: str) -> None:
        done = check(str(WORKLOADS / "pod.yaml"), *args, "--output", "json")
        assert rules(done)["cuda"] == status, done.stdout

    def test_require_cuda_env_and_its_fix(self, tmp_path: Path) -> None:
        pod = base_pod()
        container(pod)["env"] = [{"name": "NVIDIA_REQUIRE_CUDA",
                                  "value": "cuda>=12.4 brand=tesla,driver>=470,driver<471"}]
        done = check(write(tmp_path, pod), "--driver", "525.60.13")
        assert done.exit_code == 0, done.output
        done = check(write(tmp_path, pod), "--driver", "470.256.02")
        assert done.exit_code == 14
        assert "FAIL  cuda           container cuda: CUDA 12.4 GA needs driver >= 550.54.14" \
            in done.stdout
        assert "fix: run it on nodes with driver >= 550.54.14, or build the image with CUDA " \
               "11.4 or older" in done.stdout

    @pytest.mark.parametrize("args", [("--cuda", "twelve"), ("--driver", "535")])
    def test_malformed_versions_exit_2(self, args: tuple[str, ...]) -> None:
        done = check(str(WORKLOADS / "pod.yaml"), *args)
        assert done.exit_code == 2
        assert len(done.stderr.splitlines()) == 1


class TestBadInput:
    @pytest.mark.parametrize(("content", "message"), [
        ("kind: Pod\n  name: [x\n", "is not valid YAML or JSON at line"),
        ("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
         "holds no workload (found Service/s)"),
        ("- just\n- a list\n", "is a list, not a Kubernetes object"),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {}\n",
         "(Pod) has no list of named containers"),
        ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {}\n",
         "(Deployment) has no spec.template.spec"),
        ("kind: Pod\nspec: {containers: [{name: c}]}\n", "has no apiVersion or kind"),
        ("", "holds no workload"),
        ("[" * 5000, "nested deeper than 100 levels"),
    ])
    def test_one_line_exit_2(self, tmp_path: Path, content: str, message: str) -> None:
        path = tmp_path / "bad.yaml"
        path.write_text(content)
        done = check(str(path))
        assert done.exit_code == 2, done.output
        (line,) = done.stderr.splitlines()
        assert line.startswith("error(config): ")
        assert message in line
        assert done.stdout == ""

    def test_ten_megabytes(self, tmp_path: Path) -> None:
        path = tmp_path / "huge.yaml"
        pod = (WORKLOADS / "pod.yaml").read_text()
        with path.open("w") as handle:
            while handle.tell() < 10 * 1024 * 1024:
                handle.write(pod + "---\n")
        done = check(str(path))
        assert done.exit_code == 2
        (line,) = done.stderr.splitlines()
        assert "is larger than 4 MiB" in line

    def test_missing_file(self, tmp_path: Path) -> None:
        done = check(str(tmp_path / "nope.yaml"))
        assert done.exit_code == 2
        assert "cannot read" in done.stderr

    def test_bad_node_labels(self, tmp_path: Path) -> None:
        labels = tmp_path / "labels.yaml"
        labels.write_text("- not\n- labels\n")
        done = check(str(WORKLOADS / "pod.yaml"), "--node-labels", str(labels))
        assert done.exit_code == 2
        assert "is neither a Node nor a mapping of labels" in done.stderr

    def test_needs_no_node(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without --here, the host mounts are never read (none exist here)."""
        monkeypatch.setenv("HOST_ROOT", "/nonexistent-host-root")
        done = check(str(WORKLOADS / "pod.yaml"), "--driver", DRIVER)
        assert done.exit_code == 0, done.output



class TestManualExamples:
    """Acceptance: docs/gpu-pods.md's check-pod examples do what the page says they do."""

    PAGE = Path(__file__).resolve().parents[2] / "docs" / "gpu-pods.md"

    def _block(self, marker: str) -> str:
        text = self.PAGE.read_text(encoding="utf-8")
        start = text.index(f"```yaml\n# check-pod example: {marker}\n") + len("```yaml\n")
        return text[start:text.index("```", start)]

    def _run(self, tmp_path: Path, marker: str) -> Result:
        path = tmp_path / f"{marker}.yaml"
        path.write_text(self._block(marker))
        kubernetes_validate.validate(yaml.safe_load(path.read_text()), "1.33.0", strict=True)
        return check(str(path), "--driver", DRIVER)

    def test_correct_example_passes(self, tmp_path: Path) -> None:
        done = self._run(tmp_path, "correct")
        assert done.exit_code == 0, done.output

    def test_wrong_example_names_each_broken_rule(self, tmp_path: Path) -> None:
        done = self._run(tmp_path, "wrong")
        assert done.exit_code == 14
        failed = [line.split()[1] for line in done.stdout.splitlines()
                  if line.startswith("  FAIL")]
        assert failed == ["requests", "whole", "cuda"]
        shown = self.PAGE.read_text(encoding="utf-8")
        assert done.stdout.strip() in shown  # the output the page shows is current
        assert done.stderr.startswith("error(incompatible): 3 rule(s) fail")


def test_the_deploy_example_pod_passes() -> None:
    """daemonset/examples/gpu-pod.yaml (GKE: selects by gke-accelerator) is a correct pod."""
    example = Path(__file__).resolve().parents[2] / "daemonset/examples/gpu-pod.yaml"
    done = check(str(example), "--driver", DRIVER, "--cuda", "12.2")
    assert done.exit_code == 0, done.output
