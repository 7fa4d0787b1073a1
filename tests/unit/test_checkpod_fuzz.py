"""`check-pod` on any YAML/JSON document set: exit 0, 14 or 2, one line per
problem, never a traceback. Hypothesis builds the inputs three ways: our own example
manifests with parts replaced by junk, arbitrary data dumped as YAML or JSON, and text made of
YAML's and templates' own punctuation. The CLI runs in-process (click's runner) for speed;
bounded so it takes seconds on a loaded 2-core machine."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from installer.cli import cli
from installer.compat.pods.workloads import read_documents

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
POD = (WORKLOADS / "pod.yaml").read_text()
CORPUS = [d for p in sorted([*WORKLOADS.glob("*.yaml"), *WORKLOADS.glob("shapes/*.yaml")])
          for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict)]
WORDS = ("containers", "initContainers", "name", "image", "resources", "limits", "requests",
         "nvidia.com/gpu", "amd.com/gpu", "template", "spec", "metadata", "replicas",
         "parallelism", "tolerations", "nodeSelector", "affinity", "env", "kind", "apiVersion",
         "items", "List", "Pod", "key", "operator", "effect", "NoSchedule", "Exists", "value",
         "1", "500m", "2Gi", "CUDA_VERSION", "12.4", "nvidia/cuda:12.4.1-base-ubuntu22.04",
         "workerGroupSpecs", "leaderWorkerTemplate", "replicatedJobs", "templates")
FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

scalars = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(WORDS))
junk = st.recursive(scalars, lambda inner: (
    st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(WORDS) | st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


def places(node: Any) -> Iterator[tuple[Any, Any]]:
    """Every (container, key or index) of a document, to put junk there."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield node, key
            yield from places(value)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield node, index
            yield from places(value)


@st.composite
def broken_manifests(draw: st.DrawFn) -> Any:
    """One of our examples with up to four of its parts replaced by junk."""
    return with_junk(draw, copy.deepcopy(draw(st.sampled_from(CORPUS))))


def with_junk(draw: st.DrawFn, document: Any) -> Any:
    """The document with up to four of its parts replaced by junk."""
    for _ in range(draw(st.integers(0, 4))):
        container, key = draw(st.sampled_from(list(places(document))))
        container[key] = draw(junk)
    return document


def dump(documents: list[Any], as_json: bool) -> str:
    if as_json and len(documents) == 1:
        return json.dumps(documents[0], default=str)
    return yaml.safe_dump_all(documents, allow_unicode=True)


yaml_text = st.lists(st.sampled_from([
    "---", "...", "%YAML 1.1", "apiVersion: v1", "kind: Pod", "kind: List", "items:",
    "metadata: {name: x}", "spec:", "  containers:", "  - name: c", "    image: {{ .Values.i }}",
    "{{- if .Values.gpu }}", "{{ end }}", "  token: %TOKEN%", "  x: @y@", "a: &a [*a]",
    "b: *nope", "c: !!binary ===", "d: 2020-13-45", "e: !!int x", "[", "]", "{", "}", ":",
    "- ", "  - ", "\t", "\r", "---\r", "#", "\x00", "\ufeff", "é", "key: 'unterminated",
    'k: "\\q"',
    "  resources: {limits: {nvidia.com/gpu: 1}}", "containers: []", "template:",
    "apiVersion: ray.io/v1", "kind: RayCluster", "workerGroupSpecs: [{template: {}}]",
]) | st.text(max_size=10), max_size=25).map("\n".join)


def run(text: str, *args: str) -> None:
    """check-pod on `text` from stdin: the exit codes and lines the issue promises."""
    done = CliRunner().invoke(cli, ["check-pod", "-", *args], input=text)
    assert done.exit_code in (0, 2, 14), (done.exit_code, done.output, done.exception)
    assert "Traceback" not in done.output and "error(internal)" not in done.stderr
    lines = done.stderr.splitlines()
    if done.exit_code == 0:
        assert lines == []
    else:
        (line,) = lines
        assert line.startswith("error(config): " if done.exit_code == 2
                               else "error(incompatible): ")
    if done.exit_code == 2 and "--output" in args:  # the failure as an object, for scripts
        failure = json.loads(done.stdout)
        assert failure["exit_code"] == 2 and failure["error"] == line
    elif done.exit_code == 2:
        assert done.stdout == ""
    elif "--output" in args:
        assert isinstance(json.loads(done.stdout)["workloads"], list)
    problems = read_documents(text.encode("utf-8", "surrogatepass"), "-").problems
    assert all(p.isprintable() and "; fix: " in p for p in problems)


class TestAnyInput:
    @FAST
    @given(st.lists(broken_manifests(), min_size=1, max_size=3), st.booleans(),
           st.booleans())
    def test_our_examples_with_junk_in_them(self, documents: list[Any], as_json: bool,
                                           json_out: bool) -> None:
        run(dump(documents, as_json), "--driver", "535.261.03",
            *(("--output", "json") if json_out else ()))

    @FAST
    @given(st.lists(junk, max_size=3), st.booleans())
    def test_arbitrary_data(self, documents: list[Any], as_json: bool) -> None:
        run(dump(documents, as_json))

    @FAST
    @given(yaml_text)
    def test_yaml_punctuation_and_templates(self, text: str) -> None:
        run(text, "--output", "json")

    @FAST
    @given(st.lists(broken_manifests() | junk | yaml_text, max_size=4), st.data())
    def test_a_good_pod_among_bad_documents_is_judged(self, others: list[Any],
                                                      data: st.DataObject) -> None:
        """A document that cannot be read hides none of the others."""
        chunks = [o if isinstance(o, str) else dump([o], False) for o in others]
        where = data.draw(st.integers(0, len(chunks)))
        chunks.insert(where, POD)
        text = "".join(f"---\n{c}\n" for c in chunks)
        run(text, "--driver", "535.261.03")
        documents = read_documents(text.encode("utf-8", "surrogatepass"), "-")
        assert "cuda-vector-add" in [w.name for w in documents.workloads]


NODES = [d for p in sorted(WORKLOADS.rglob("*.yaml")) for d in yaml.safe_load_all(p.read_text())
         if isinstance(d, dict) and d.get("kind") in ("Node", "List")]


@st.composite
def broken_nodes(draw: st.DrawFn) -> Any:
    """One of our Nodes (or Lists of them) with up to four parts replaced by junk, or junk."""
    if not draw(st.integers(0, 3)):
        return draw(junk)
    return with_junk(draw, copy.deepcopy(draw(st.sampled_from(NODES))))


class TestAnyNode:
    """`--node-labels FILE` is input too: any document there gives the same promise."""

    @FAST
    @given(broken_nodes(), st.sampled_from(sorted(WORKLOADS.rglob("*.yaml"))), st.booleans())
    @example({"apiVersion": "v1", "kind": "Node", "spec": {  # a taint with a list as key
        "taints": [{"key": [], "value": "present", "effect": "NoSchedule"}]}, "metadata": {
            "name": "n", "labels": {"cloud.google.com/gke-accelerator": "nvidia-l4"}}},
        WORKLOADS / "pod.yaml", False)
    def test_our_nodes_with_junk_in_them(self, tmp_path_factory: pytest.TempPathFactory,
                                         node: Any, workload: Path, as_json: bool) -> None:
        path = tmp_path_factory.mktemp("node") / "node.yaml"
        path.write_text(dump([node], as_json))
        done = CliRunner().invoke(cli, ["check-pod", str(workload), "--node-labels",
                                        str(path), "--output", "json"])
        assert done.exit_code in (0, 2, 14), (done.exit_code, done.output, done.exception)
        assert "error(internal)" not in done.stderr
        assert len(done.stderr.splitlines()) == (0 if done.exit_code == 0 else 1)


class TestWholeProcess:
    """The same promise from a real process, for inputs that once were tracebacks."""

    def test_junk_documents(self, tmp_path: Path) -> None:
        path = tmp_path / "junk.yaml"
        path.write_text("--- [1, {a: b}]\n--- !!binary aGk=\n--- {kind: Pod, apiVersion: v1, "
                        "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: "
                        ".nan}}}]}}\n--- {{ .Values }}\n")
        done = subprocess.run([sys.executable, "-m", "installer", "check-pod", str(path)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode in (0, 2, 14)
        assert "Traceback" not in done.stderr
        assert len(done.stderr.splitlines()) <= 1

    def test_a_quantity_with_a_huge_exponent(self, tmp_path: Path) -> None:
        """`1e999999999` is no GPU count to compute (10**999999999 would take hours)."""
        pod = yaml.safe_load(POD)
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1e999999999"
        path = tmp_path / "pod.json"
        path.write_text(json.dumps(pod))
        done = subprocess.run([sys.executable, "-m", "installer", "check-pod", str(path),
                               "--output", "json"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 14, done.stderr
        assert len(done.stderr.splitlines()) == 1
