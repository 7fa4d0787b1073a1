"""`check-pod` on the files people really have: Helm templates get "render it
first", a document that cannot be read is one problem line and hides none of the others, a
Secret with a placeholder does not break the file, multi-document files and Lists; exit 2
only when nothing at all can be checked, as one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from installer.cli import cli
from installer.compat.pods.workloads import Documents, read_documents

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
POD = (WORKLOADS / "pod.yaml").read_text()  # a GPU pod that passes with --driver
DRIVER = "535.261.03"
HELM_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "chart.fullname" . }}
spec:
  replicas: {{ .Values.replicaCount }}
  template:
    spec:
      containers:
        - name: server
          image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
"""
# quoted everywhere, so it parses: still not a manifest until rendered
HELM_QUOTED = """\
apiVersion: v1
kind: Pod
metadata:
  name: "{{ .Release.Name }}-probe"
spec:
  containers:
    - name: probe
      image: "{{ .Values.image }}"
"""


@pytest.fixture(autouse=True)
def _termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERMINATION_LOG", str(tmp_path / "termination-log"))


def check(path: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["check-pod", str(path), "--driver", DRIVER, *args])


def write(tmp_path: Path, *documents: str, name: str = "in.yaml") -> Path:
    path = tmp_path / name
    path.write_text("---\n".join(documents))
    return path


def read(path: Path) -> Documents:
    return read_documents(path.read_bytes(), str(path))


def one_error(done: Result) -> str:
    """Exit 2 with exactly one line on stderr and nothing on stdout."""
    assert done.exit_code == 2, done.output
    (line,) = done.stderr.splitlines()
    assert line.startswith("error(config): ")
    assert done.stdout == ""
    return line


class TestTemplates:
    def test_a_helm_template_alone_is_refused_with_the_fix(self, tmp_path: Path) -> None:
        path = write(tmp_path, HELM_DEPLOYMENT)
        line = one_error(check(path))
        assert f"{path} document 1 (Deployment) is a template ({{{{ at line 4)" in line
        assert "fix: render it first (`helm template RELEASE CHART | gpu-node-installer " \
               "check-pod -`)" in line

    def test_a_template_that_happens_to_parse_is_refused_too(self, tmp_path: Path) -> None:
        line = one_error(check(write(tmp_path, HELM_QUOTED)))
        assert "document 1 (Pod) is a Helm template ({{ at line 4)" in line
        assert "helm template" in line

    def test_the_rendered_documents_beside_a_template_are_checked(
            self, tmp_path: Path) -> None:
        path = write(tmp_path, POD, HELM_DEPLOYMENT, POD)
        done = check(path, "--output", "json")
        assert done.exit_code == 0, done.output
        assert [w["document"] for w in json.loads(done.stdout)["workloads"]] == [1, 3]
        documents = read(path)
        (problem,) = documents.problems
        first_line = POD.count("\n") + 2  # after the pod and its `---`
        assert problem.startswith(f"{path} document 2 (Deployment) is a template "
                                  f"({{{{ at line {first_line + 3})")

    def test_argo_expressions_are_not_helm(self, tmp_path: Path) -> None:
        workflow = """\
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: echo-}
spec:
  entrypoint: echo
  templates:
    - name: echo
      container:
        image: busybox
        args: ["{{workflow.name}}", "{{inputs.parameters.message}}"]
"""
        documents = read(write(tmp_path, workflow))
        assert documents.problems == ()
        assert [w.path for w in documents.workloads] == ["spec.templates[0]"]

    def test_a_commands_own_go_template_is_not_helm(self, tmp_path: Path) -> None:
        job = """\
apiVersion: batch/v1
kind: Job
metadata: {name: list-gpu-nodes}
spec:
  template:
    metadata:
      annotations: {note: "{{ .Values.x }} is not ours to render"}
    spec:
      restartPolicy: Never
      containers:
        - name: kubectl
          image: bitnami/kubectl:1.31
          command: ["kubectl", "get", "nodes", "-o",
                    "go-template={{range .items}}{{.metadata.name}} {{end}}"]
"""
        documents = read(write(tmp_path, job))
        assert documents.problems == ()
        assert [w.name for w in documents.workloads] == ["list-gpu-nodes"]

    def test_templates_in_objects_that_run_nothing_are_left_alone(
            self, tmp_path: Path) -> None:
        rule = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: alerts}
data:
  summary: "GPU {{ $labels.gpu }} on {{ $labels.instance }} is hot"
"""
        documents = read(write(tmp_path, rule, POD))
        assert documents.problems == ()
        assert documents.skipped == ("ConfigMap/alerts",)


class TestUnreadableDocuments:
    def test_a_broken_document_hides_none_of_the_others(self, tmp_path: Path) -> None:
        broken = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: [unclosed\n"
        path = write(tmp_path, POD, broken, POD)
        done = check(path, "--output", "json")
        assert done.exit_code == 0, done.output
        assert [w["document"] for w in json.loads(done.stdout)["workloads"]] == [1, 3]
        (problem,) = read(path).problems
        assert problem.startswith(f"{path} document 2 (Pod) is not valid YAML or JSON at line ")
        line = int(problem.split(" at line ")[1].split(",")[0])
        assert path.read_text().splitlines()[line - 1].strip() != ""  # a line of the file
        assert problem.endswith("; fix: fix the syntax (`kubectl apply --dry-run=client -f` "
                                "shows it too)")

    @pytest.mark.parametrize(("secret", "problem"), [
        ("stringData:\n  token: %HF_TOKEN%\n", "holds a placeholder (%HF_TOKEN% at line"),
        ("stringData:\n  token: @TOKEN@\n", "holds a placeholder (@TOKEN@ at line"),
        ("stringData:\n  token: {{ HF_TOKEN }}\n", "is a template ({{ at line"),
    ])
    def test_a_secret_with_a_placeholder_does_not_break_the_file(
            self, tmp_path: Path, secret: str, problem: str) -> None:
        document = f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: hf\n{secret}"
        path = write(tmp_path, document, POD)
        done = check(path)
        assert done.exit_code == 0, done.output
        assert "Pod/cuda-vector-add (document 2):" in done.stdout
        (line,) = read(path).problems
        assert line.startswith(f"{path} document 1 (Secret/hf) {problem}")

    def test_placeholders_yaml_can_read_are_no_problem(self, tmp_path: Path) -> None:
        secret = ("apiVersion: v1\nkind: Secret\nmetadata: {name: hf}\n"
                  "stringData:\n  token: <your-token>\n  other: ${TOKEN}\n")
        documents = read(write(tmp_path, secret, POD))
        assert documents.problems == ()
        assert documents.skipped == ("Secret/hf",)

    @pytest.mark.parametrize(("document", "problem"), [
        ("just a sentence\n", "document 1 is a str, not a Kubernetes object"),
        ("- a\n- b\n", "document 1 is a list, not a Kubernetes object"),
        ("kind: Pod\nspec: {}\n", "document 1 has no apiVersion or kind"),
        ("apiVersion: v1\nkind: Pod\nmetadata: {created: 2020-13-45}\n",
         "document 1 (Pod) is not valid YAML or JSON: month must be in 1..12"),
        ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {}\n",
         "document 1 (Deployment) has no spec.template.spec"),
        ("apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: l}\n"
         "spec: {leaderWorkerTemplate: {workerTemplate: {spec: {containers: [x]}}}}\n",
         "document 1 (LeaderWorkerSet) has no list of named containers in "
         "spec.leaderWorkerTemplate.workerTemplate"),
    ])
    def test_each_problem_is_one_line_naming_its_document(
            self, tmp_path: Path, document: str, problem: str) -> None:
        path = write(tmp_path, document, POD)
        documents = read(path)
        (line,) = documents.problems
        assert line.startswith(f"{path} {problem}")
        assert "\n" not in line and "; fix: " in line
        assert [w.document for w in documents.workloads] == [2]

    def test_nothing_checkable_is_one_line_naming_the_first_problem(
            self, tmp_path: Path) -> None:
        path = write(tmp_path, HELM_DEPLOYMENT, "kind: [\n", HELM_QUOTED)
        line = one_error(check(path))
        assert f"{path}: no document could be checked (3 could not be read; the first: " \
               f"{path} document 1 (Deployment) is a template" in line
        assert line.endswith("fix: render it first (`helm template RELEASE CHART | "
                             "gpu-node-installer check-pod -`)")

    def test_objects_without_pods_are_kept_for_the_rules(self, tmp_path: Path) -> None:
        claim = ("apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\n"
                 "metadata: {name: one-gpu}\nspec:\n  spec:\n    devices:\n      requests:\n"
                 "        - name: gpu\n          exactly: {deviceClassName: gpu.nvidia.com}\n")
        documents = read(write(tmp_path, claim, POD))
        assert [o["kind"] for o in documents.others] == ["ResourceClaimTemplate"]
        assert documents.skipped == ("ResourceClaimTemplate/one-gpu",)
        assert documents.checkable


class TestStreams:
    def test_a_list_with_a_bad_item(self, tmp_path: Path) -> None:
        listed = {"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}},
            "oops",
            yaml.safe_load(POD)]}
        path = tmp_path / "list.json"
        path.write_text(json.dumps(listed))
        documents = read(path)
        assert documents.problems == (
            f"{path} document 1 item 2 is a str, not a Kubernetes object; fix: each document "
            "must be a mapping with apiVersion and kind",)
        assert documents.skipped == ("Service/s",)
        assert [(w.document, w.kind) for w in documents.workloads] == [(1, "Pod")]

    def test_directives_comments_and_empty_documents(self, tmp_path: Path) -> None:
        path = tmp_path / "in.yaml"
        path.write_text(f"# a header\n%YAML 1.1\n---\n---\n{POD}...\n---\n# bye\n---\n")
        documents = read(path)
        assert documents.problems == ()
        assert [w.document for w in documents.workloads] == [1]

    def test_document_start_lines_with_content(self, tmp_path: Path) -> None:
        path = tmp_path / "in.yaml"
        path.write_text('--- {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}'
                        f"\n--- \n{POD}")
        documents = read(path)
        assert documents.skipped == ("Service/s",)
        assert [w.document for w in documents.workloads] == [2]

    def test_windows_line_ends(self, tmp_path: Path) -> None:
        """A file saved on Windows is cut into documents too: the broken one stays alone."""
        path = tmp_path / "in.yaml"
        path.write_bytes(f"{POD}---\nkind: [\n---\n{POD}".replace("\n", "\r\n").encode())
        documents = read(path)
        assert [w.document for w in documents.workloads] == [1, 3]
        (problem,) = documents.problems
        assert f"{path} document 2 is not valid YAML or JSON at line " in problem

    def test_utf16_with_its_byte_order_mark(self, tmp_path: Path) -> None:
        path = tmp_path / "in.yaml"
        path.write_bytes(POD.encode("utf-16"))
        assert check(path).exit_code == 0

    def test_not_utf8_is_one_line(self, tmp_path: Path) -> None:
        path = tmp_path / "in.yaml"
        path.write_bytes(POD.encode() + b"# caf\xe9\n")
        assert "is not UTF-8 text" in one_error(check(path))


class TestWholeProcess:
    """The real CLI in a subprocess, as a user runs it."""

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "installer", "check-pod", *args],
                              capture_output=True, text=True, timeout=60, check=False)

    def test_a_chart_with_one_rendered_pod(self, tmp_path: Path) -> None:
        done = self.run(str(write(tmp_path, HELM_DEPLOYMENT, POD)), "--driver", DRIVER)
        assert done.returncode == 0, done.stderr
        assert "Pod/cuda-vector-add (document 2):" in done.stdout

    def test_an_unrendered_chart_from_stdin(self) -> None:
        done = subprocess.run([sys.executable, "-m", "installer", "check-pod", "-"],
                              input=HELM_DEPLOYMENT, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 2
        (line,) = done.stderr.splitlines()
        assert line.startswith("error(config): - document 1 (Deployment) is a template")
        assert "Traceback" not in done.stderr
