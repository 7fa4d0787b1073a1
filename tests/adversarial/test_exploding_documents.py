"""Documents built to explode: YAML aliases that expand without end ("billion laughs"),
nesting 10^5 deep, an alias inside the node it names, in every YAML or JSON input an operator
gives (check-pod's manifests and `--node-labels`, mig-parted files, gpu_config.json,
`--aliases-from`).

One loader (`installer.node.documents`) bounds the depth, the alias uses and what the aliases
expand to from the parser's events, before any Python object is built. Each case: exit 2
within the test's 5 s, one line naming the file and the limit, nothing written in the arena.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adversarial.harness import Arena, Result, refused_untouched, settle

CASE_S = 5  # every case ends within this, or the subprocess is killed and the case fails


def _laughs(levels: int = 9) -> str:
    """The classic: nine lols, each level nine aliases of the one before (9**9 leaves)."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    previous = "a"
    for name in "bcdefghijklmnopq"[:levels - 1]:
        lines.append(f"{name}: &{name} [{','.join([f'*{previous}'] * 9)}]")
        previous = name
    return "\n".join(lines) + "\n"


DEEP_FLOW = "[" * 100_000 + "]" * 100_000
DEEP_JSON = '{"a": ' * 100_000 + "1" + "}" * 100_000
EXPLODING: dict[str, tuple[str, str]] = {  # id: (text, the limit the line names)
    "billion laughs": (_laughs(), "aliases expand to more than 400000 nodes"),
    "nesting 10^5 deep (flow)": (DEEP_FLOW, "nested deeper than 100 levels"),
    "JSON objects 10^5 deep": (DEEP_JSON, "nested deeper than 100 levels"),
    "block nesting": ("".join(" " * i + "- \n" for i in range(300)),
                      "nested deeper than 100 levels"),
    "recursive alias": ("a: &a [x, *a]\n", "is inside the node it names"),
    "many aliases": ("a: &a x\nb: [" + ", ".join(["*a"] * 10_001) + "]\n",
                     "more than 10000 alias uses"),
}


def _write(arena: Arena, name: str, text: str) -> Path:
    path = arena.scene.work / name
    path.write_text(text)
    return path


def _refused(arena: Arena, args: list[str], code: int, *causes: str,
             env: dict[str, str] | None = None) -> Result:
    return refused_untouched(arena, lambda: arena.run(*args, env=env, timeout=CASE_S), code,
                             *causes)


@pytest.mark.parametrize("case", EXPLODING)
def test_check_pod_manifest(arena: Arena, case: str) -> None:
    text, limit = EXPLODING[case]
    path = _write(arena, "workload.yaml", text)
    _refused(arena, ["check-pod", str(path), "--driver", "535.261.03"], 2,
             f"{path} document 1: ", limit)


@pytest.mark.parametrize("case", ["billion laughs", "JSON objects 10^5 deep",
                                  "recursive alias"])
def test_check_pod_node_labels(arena: Arena, case: str) -> None:
    text, limit = EXPLODING[case]
    pod = _write(arena, "pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n"
                                    "  containers: [{name: c, image: cuda}]\n")
    labels = _write(arena, "node.yaml", text)
    _refused(arena, ["check-pod", str(pod), "--node-labels", str(labels)], 2,
             f"--node-labels {labels}: ", limit)


def test_a_bomb_among_workloads_hides_none_of_them(arena: Arena) -> None:
    """The exploding document is one problem line; the pod beside it is still judged."""
    pod = ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n"
           "  containers: [{name: c, image: cuda}]\n")
    path = _write(arena, "mixed.yaml", f"{_laughs()}---\n{pod}")
    done = arena.run("check-pod", str(path), "--driver", "535.261.03", "--output", "json",
                     timeout=CASE_S)
    assert "Traceback" not in done.stderr and "error(internal)" not in done.stderr
    report = json.loads(done.stdout)
    assert [w["name"] for w in report["workloads"]] == ["p"], report
    assert any("aliases expand to more than 400000 nodes" in p
               for p in report.get("problems", [])), report


@pytest.mark.parametrize("case", ["billion laughs", "nesting 10^5 deep (flow)",
                                  "recursive alias"])
def test_mig_parted_file(arena: Arena, case: str) -> None:
    text, limit = EXPLODING[case]
    path = _write(arena, "mig.yaml", text)
    settle(arena)
    _refused(arena, ["partition", "--dry-run", *arena.args("--mig-config-file", str(path),
                                                           "--mig-config", "all")],
             2, str(path), limit)


def test_gpu_config_json(arena: Arena) -> None:
    """GKE's file on the node: JSON, so the JSON loader's depth (16) is the limit."""
    path = arena.root / "etc/nvidia/gpu_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(DEEP_JSON)
    settle(arena)
    _refused(arena, ["partition", "--dry-run", *arena.args()], 2,
             "/etc/nvidia/gpu_config.json: nested deeper than 16 levels")


@pytest.mark.parametrize(("body", "limit"), [
    (DEEP_JSON, "nested deeper than 16 levels"),
    ('{"aliases": {"latest": ' + "9" * 100_000 + "}}", "a number of 100000 characters"),
])
def test_aliases_from(arena: Arena, body: str, limit: str) -> None:
    path = _write(arena, "aliases.json", body)
    _refused(arena, ["package", "index", str(arena.scene.repo), "--aliases-from", str(path)],
             2, f"--aliases-from {path}: ", limit)


def test_messages_quote_a_bounded_prefix(arena: Arena) -> None:
    """A hostile anchor name of 100 000 characters is quoted by its first 40 only."""
    anchor = "x" * 100_000
    path = _write(arena, "workload.yaml", f"a: &{anchor} [*{anchor}]\n")
    done = _refused(arena, ["check-pod", str(path)], 2, "is inside the node it names")
    assert len(done.lines[0]) < 1000, len(done.lines[0])

