"""Read workloads from YAML or JSON and find every pod template in each (for `check-pod`).

The input is bounded (a workload is a few KiB; the API server stores at most ~1.5 MiB) and
parsed with a safe loader only, one document at a time: a document that cannot be read (a Helm
template, a placeholder, a syntax error) is one line in `Documents.problems` and hides none of
the others. Where the shapes are is `shapes`' business.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.compat.pods import fields, shapes
from installer.compat.pods.template import ShapeError, Template
from installer.errors import ConfigError, printable
from installer.node.documents import YamlBudget, read_yaml
from installer.node.files import read_regular

MAX_BYTES = 4 * 1024 * 1024
# A line that starts a YAML document; no document's content can start with it at column 0.
DOCUMENT_START = re.compile(r"^---(?=[ \t\r]|$)", re.MULTILINE)
# Go-template actions as Helm charts write them (`{{ .Values.x }}`, `{{- if }}`, `{{ include }}`);
# Argo's `{{inputs.parameters.x}}` is not one of them: it is the workflow's own syntax.
HELM_ACTION = re.compile(
    r"\{\{-|-\}\}|\{\{\s*(?:[.$]|/\*|(?:include|template|toYaml|toJson|tpl|if|else|end|"
    r"range|with|define|block|required|default|quote|printf|lookup|fail)\b)")
# What people leave for a value to be filled in later, where YAML cannot read it.
PLACEHOLDER = re.compile(r"\{\{[^}\n]*\}\}|\$\{[^}\n]*\}|%[A-Za-z_][\w.-]*%|@[A-Za-z_][\w.-]*@"
                         r"|<[A-Za-z][^<>\n]*>")
KIND_LINE = re.compile(r"^kind:[ \t]*[\"']?([A-Za-z][\w.-]*)", re.MULTILINE)
NAME_LINE = re.compile(r"^[ \t]+name:[ \t]*[\"']?([\w.-]+)", re.MULTILINE)
RENDER = "render it first (`helm template RELEASE CHART | gpu-node-installer check-pod -`)"


class WorkloadError(ConfigError):
    """The input is not YAML/JSON, too large, or holds no valid workload (exit 2)."""


@dataclass(frozen=True)
class Workload:
    """One PodSpec of a document and what names it in a report.

    An object may hold several pod templates (a LeaderWorkerSet's leader and workers, each
    worker group of a RayCluster): each is its own Workload, told apart by `path`.
    """

    document: int
    kind: str
    name: str
    namespace: str | None
    spec: Mapping[str, Any]
    path: str = ""                  # where the template is, e.g. "spec.template"; "" for a Pod
    replicas: int | None = None     # how many pods of this template the object asks for
    multiplicity: str = ""          # how the object says so, e.g. "parallelism 4"; shown

    @property
    def title(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        title = f"{self.kind}/{where}{self.name}"
        if self.path:
            title += f" {self.path}"
        if self.multiplicity:
            title += f" ({self.multiplicity})"
        return printable(title)  # names come from the document: no control characters


@dataclass(frozen=True)
class Documents:
    """The workloads of an input, the documents skipped as not workloads, one line per
    document that could not be read (`problems`), and every parsed document that is not a
    workload (`others`: ResourceClaims, DeviceClasses, Nodes) for the rules that need them."""

    workloads: tuple[Workload, ...]
    skipped: tuple[str, ...]
    problems: tuple[str, ...] = ()
    others: tuple[Mapping[str, Any], ...] = ()

    @property
    def checkable(self) -> bool:
        """Whether anything can be judged; when not, the command exits 2 (the input is bad)."""
        return bool(self.workloads)


WORKLOAD_REMEDY = "give the workload's own manifest (a few KiB)"
NODES_REMEDY = ("give --node-labels `kubectl get node NAME -o yaml` (one Node) or `kubectl get "
                "nodes -o yaml` output")


def read_input(source: str, *, too_large: str = WORKLOAD_REMEDY) -> bytes:
    """The bytes of FILE, or of stdin for `-`, refusing more than MAX_BYTES (with the
    remedy `too_large`: a workload's and a node file's differ); FILE must be a regular file
    (a FIFO, device, socket or directory is named as such, never read)."""
    if source == "-":
        try:
            data = sys.stdin.buffer.read(MAX_BYTES + 1)
        except OSError as exc:
            raise WorkloadError(f"cannot read stdin: {exc.strerror or exc}",
                                remedy="give a readable YAML or JSON file, or - for stdin"
                                ) from None
    else:
        found = read_regular(Path(source), MAX_BYTES, error=WorkloadError, name=source,
                             oversize=False, remedy="give a regular YAML or JSON file, or "
                                                    "pipe it to - (stdin)")
        if found is None:
            raise WorkloadError(f"cannot read {source}: No such file or directory",
                                remedy="give a readable YAML or JSON file, or - for stdin")
        data = found
    if len(data) > MAX_BYTES:
        raise WorkloadError(f"{source} is larger than {MAX_BYTES // (1024 * 1024)} MiB",
                            remedy=too_large)
    return data


@dataclass(frozen=True)
class Problem:
    """Why one document could not be read, and what to do about it."""

    message: str
    remedy: str

    @property
    def line(self) -> str:
        return printable(f"{self.message}; fix: {self.remedy}")


def parse(data: bytes, source: str) -> Documents:
    """Every workload of a YAML/JSON stream; WorkloadError (exit 2) when none can be checked,
    naming the first document that could not be read, or what the input holds instead."""
    documents, problems = _read(data, source)
    if documents.checkable:
        return documents
    if len(problems) == 1:
        raise WorkloadError(problems[0].message, remedy=problems[0].remedy)
    if problems:
        raise WorkloadError(f"{source}: no document could be checked ({len(problems)} could "
                            f"not be read; the first: {problems[0].message})",
                            remedy=problems[0].remedy)
    found = list(documents.skipped[:5]) + (
        [f"{len(documents.skipped) - 5} more"] if len(documents.skipped) > 5 else [])
    what = f" (found {', '.join(found)})" if found else ""
    raise WorkloadError(f"{source} holds no workload{what}",
                        remedy=f"give a manifest that holds a pod template: {shapes.KINDS_TEXT}")


def read_documents(data: bytes, source: str) -> Documents:
    """Every document of a YAML/JSON stream, `kind: List` unpacked, each read on its own."""
    return _read(data, source)[0]


def _read(data: bytes, source: str) -> tuple[Documents, list[Problem]]:
    import yaml  # type: ignore[import-untyped]  # only check-pod needs it

    found = _Found(source)
    budget = YamlBudget()  # one input's bounds, whatever the number of its documents
    number = 0
    for first_line, chunk in _chunks(_text(data, source)):
        try:
            loaded = read_yaml(chunk, name=f"{source} document {number + 1}",
                               error=WorkloadError, budget=budget)
        except WorkloadError as exc:  # past a bound: this document only, the rest is read
            number += 1
            found.problems.append(Problem(exc.message, exc.remedy))
            continue
        except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError,
                MemoryError) as exc:
            number += 1
            found.problems.append(_unreadable(exc, chunk, first_line,
                                              f"{source} document {number}"))
            continue
        for document in loaded:
            number += 1
            for where, item in _flatten(document, f"{source} document {number}"):
                found.add(item, number, where, (first_line, chunk))
    return found.documents(), found.problems


class _Found:
    """What the documents of one input hold, gathered as they are read."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.workloads: list[Workload] = []
        self.skipped: list[str] = []
        self.others: list[Mapping[str, Any]] = []
        self.problems: list[Problem] = []

    def documents(self) -> Documents:
        return Documents(tuple(self.workloads), tuple(self.skipped),
                         tuple(p.line for p in self.problems), tuple(self.others))

    def add(self, document: Any, number: int, where: str, text: tuple[int, str]) -> None:
        """One object: its workloads, or why not (a problem), or kept as another object.
        `text` is its document's first line number and text, to point at a Helm action."""
        if not isinstance(document, dict):
            self.problems.append(Problem(
                f"{where} is a {type(document).__name__}, not a Kubernetes object",
                "each document must be a mapping with apiVersion and kind"))
            return
        kind = document.get("kind")
        if not isinstance(kind, str) or not isinstance(document.get("apiVersion"), str):
            self.problems.append(Problem(
                f"{where} has no apiVersion or kind",
                "give Kubernetes manifests (apiVersion, kind, metadata, spec)"))
            return
        try:
            found = shapes.templates(document)
        except ShapeError as exc:
            self.problems.append(Problem(f"{where} {exc.message}", exc.remedy))
            return
        helm = _helm_action(document) if found else None
        if not found:
            self.skipped.append(_describe(document))
            self.others.append(document)
        elif helm is not None:
            self.problems.append(Problem(
                f"{where} ({kind}) is a Helm template ({{{{ at line {_line_of(helm, *text)}), "
                "not a manifest yet", RENDER))
        else:
            for template in found:
                self._template(document, kind, number, where, template)

    def _template(self, document: Mapping[str, Any], kind: str, number: int, where: str,
                  template: Template) -> None:
        spec = _named_containers(template.spec, strict=kind in shapes.BUILT_IN)
        inside = f" in {template.path}" if template.path else ""
        base = "" if template.path else "spec"  # a Pod's own PodSpec is its `spec`
        wrong = fields.spec_problem(template.spec if spec is None else spec, base) \
            if isinstance(template.spec, Mapping) else None
        if spec is None:
            detail = f" ({wrong.path} {wrong.why})" if wrong is not None else ""
            self.problems.append(Problem(
                f"{where} ({kind}) has no list of named containers{inside}{detail}",
                "the PodSpec needs containers: [{name: ..., image: ...}]"))
            return
        if wrong is not None:
            self.problems.append(Problem(f"{where} ({kind}){inside}: {wrong.path} {wrong.why}",
                                         wrong.fix))
            return
        found = document.get("metadata")
        metadata: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        name = metadata.get("name") or metadata.get("generateName") or "(unnamed)"
        namespace = metadata.get("namespace")
        self.workloads.append(Workload(
            number, kind, str(name), str(namespace) if namespace else None, spec,
            template.path, template.replicas, template.multiplicity))


# Where a workload may hold Go templates of its own (`kubectl -o go-template=...` in a
# container's command, a script's source, an annotation for another tool): not Helm's.
OWN_TEMPLATES = frozenset({"command", "args", "source", "annotations"})


def _helm_action(document: Mapping[str, Any]) -> str | None:
    """The first value of a workload that holds a Helm action, outside OWN_TEMPLATES: a
    template whose actions are quoted parses as YAML but is not a manifest yet."""
    stack: list[Any] = [document]
    for _ in range(shapes.MAX_NODES):
        if not stack:
            break
        node = stack.pop()
        if isinstance(node, str) and HELM_ACTION.search(node):
            return node
        if isinstance(node, Mapping):  # reversed: the first in document order is named
            stack.extend(reversed([v for k, v in node.items() if k not in OWN_TEMPLATES]))
        elif isinstance(node, list):
            stack.extend(reversed(node))
    return None


def _line_of(value: str, first_line: int, chunk: str) -> int:
    """The line of the document's text where `value` (or, quoted another way, its first
    Helm action) is."""
    at = chunk.find(value)
    if at < 0:
        action = HELM_ACTION.search(value)
        at = max(chunk.find(action.group(0)) if action else 0, 0)
    return first_line + chunk.count("\n", 0, at)


def _named_containers(spec: Any, *, strict: bool) -> Mapping[str, Any] | None:
    """The PodSpec with every container (init containers too) a mapping with a name, or
    None. The API server demands names in its own kinds; custom resources may leave them out
    (Knative, Argo), so there a container is named by its place (`containers[0]`)."""
    if not isinstance(spec, Mapping):
        return None
    lists: dict[str, list[Mapping[str, Any]]] = {}
    for field in ("initContainers", "containers"):
        value = spec.get(field)
        value = [] if value is None else value
        if not isinstance(value, list) or not all(isinstance(c, Mapping) for c in value):
            return None
        lists[field] = value
    if not lists["containers"]:
        return None
    if all(isinstance(c.get("name"), str) for v in lists.values() for c in v):
        return spec
    if strict:
        return None
    return {**spec, **{f: [c if isinstance(c.get("name"), str) else {**c, "name": f"{f}[{i}]"}
                           for i, c in enumerate(v)] for f, v in lists.items() if f in spec}}


def _text(data: bytes, source: str) -> str:
    """The input as text: UTF-8 (a BOM allowed), or UTF-16 with its BOM, as YAML allows."""
    try:
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            return data.decode("utf-16")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{source} is not UTF-8 text (byte {exc.start})",
                            remedy="give the YAML or JSON file as UTF-8") from None


def _chunks(text: str) -> Iterator[tuple[int, str]]:
    """The text cut before each `---` line, with each piece's first line number. What comes
    before the first `---` goes with it when it holds only comments and directives
    (`%YAML 1.1`), which belong to the document that follows."""
    starts = [m.start() for m in DOCUMENT_START.finditer(text) if m.start()]
    bounds = list(zip([0, *starts], [*starts, len(text)], strict=True))
    if len(bounds) > 1 and all(not s or s.startswith(("#", "%")) for s in (
            line.strip() for line in text[:starts[0]].splitlines())):
        bounds[:2] = [(0, bounds[1][1])]
    line = 1
    for begin, end in bounds:
        yield line, text[begin:end]
        line += text.count("\n", begin, end)


def _unreadable(exc: BaseException, chunk: str, first_line: int, where: str) -> Problem:
    """One line for a document YAML cannot read: a template, a placeholder, or its syntax."""
    if isinstance(exc, RecursionError | MemoryError):
        return Problem(f"{where} is nested too deeply to be a workload",
                       "give the workload's own manifest")
    kind = KIND_LINE.search(chunk)
    name = NAME_LINE.search(chunk)
    what = where + (f" ({kind.group(1)}{'/' + name.group(1) if name else ''})" if kind else "")
    if "{{" in chunk and "}}" in chunk:
        line = first_line + chunk.count("\n", 0, chunk.index("{{"))
        return Problem(f"{what} is a template ({{{{ at line {line}), not YAML yet", RENDER)
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        text = chunk.splitlines()[mark.line] if mark.line < len(chunk.splitlines()) else ""
        held = PLACEHOLDER.search(text)
        if held:
            return Problem(f"{what} holds a placeholder ({held.group(0)} at line "
                           f"{first_line + mark.line})",
                           "fill it in, or leave this document out, before checking")
    at = f" at line {first_line + mark.line}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or next(iter(str(exc).splitlines()), "") or \
        type(exc).__name__
    return Problem(f"{what} is not valid YAML or JSON{at}: {problem}",
                   "fix the syntax (`kubectl apply --dry-run=client -f` shows it too)")


def _flatten(document: Any, where: str) -> Iterator[tuple[str, Any]]:
    if isinstance(document, dict) and document.get("kind") == "List" \
            and isinstance(document.get("items"), list):
        for index, item in enumerate(document["items"]):
            yield f"{where} item {index + 1}", item
    else:
        yield where, document


def _describe(document: Mapping[str, Any]) -> str:
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return printable(f"{document.get('kind')}/{name}" if name else str(document.get("kind")))
