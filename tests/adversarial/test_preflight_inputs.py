"""`preflight` on hostile input: a Node list (the cluster's, or one a CI job was handed) with
huge, odd or mistyped fields, documents that explode, a FIFO, and flags that smuggle control
characters.

Each case runs the real CLI sandboxed in an arena, against the arena's file:// repository;
each asserts the exit code, one printable line naming the cause (bounded: a 1 MiB field is
quoted, never echoed), and that nothing in the arena changed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from e2e import KERNEL

from adversarial.harness import Arena, Result, assert_refused, assert_untouched

TIMEOUT = 20  # seconds per run: a hang is cut off; a loaded machine still finishes
MAX_LINE = 700  # a refusal quotes at most a bounded prefix of what it refuses


def _node(name: str = "gpu-1", kernel: object = KERNEL, arch: object = "amd64",
          labels: object = None) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels or {"cloud.google.com/gke-nodepool":
                                                            "pool-a"}},
            "status": {"nodeInfo": {"kernelVersion": kernel, "architecture": arch,
                                    "osImage": "Ubuntu 22.04.4 LTS"}}}


def _list(*items: object) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)})


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n"
    for i in range(8))

# (Node list text, texts the one line must hold)
NODE_LISTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "a 1 MiB label value": (_list(_node(labels={"pool": "x" * (1 << 20)})),
                            ("node gpu-1", "is not a Kubernetes label")),
    "a label key with a newline": (_list(_node(labels={"a\nb": "c"})),
                                   ("node gpu-1", "is not a Kubernetes label")),
    "5000 labels": (_list(_node(labels={f"k{i}": "v" for i in range(5000)})),
                    ("metadata.labels is not a mapping of at most 400",)),
    "labels a list": (_list(_node(labels=["gpu"])), ("metadata.labels is not a mapping",)),
    "a 1 MiB kernel": (_list(_node(kernel="6" * (1 << 20))),
                       ("kernelVersion", "is not a kernel release")),
    "a kernel with a terminal escape": (_list(_node(kernel="6.1\x1b[2J;rm -rf /")),
                                        ("kernelVersion", "\\x1b")),
    "a kernel that climbs": (_list(_node(kernel="../../etc/passwd")),
                             ("kernelVersion", "is not a kernel release")),
    "a kernel that is a number": (_list(_node(kernel=6.1)), ("kernelVersion 6.1",)),
    "a kernel that is NaN": ('{"kind": "List", "items": [{"kind": "Node", "metadata": '
                             '{"name": "n"}, "status": {"nodeInfo": {"kernelVersion": NaN}}}]}',
                             ("--nodes",)),
    "an arch we do not build for": (_list(_node(arch="s390x")),
                                    ("architecture 's390x'", "amd64, arm64")),
    "a node name that climbs": (_list(_node(name="../../x")), ("metadata.name",)),
    "a Pod among the Nodes": (_list(_node(), {"kind": "Pod", "metadata": {"name": "p"}}),
                              ("item 2 is not a Node",)),
    "not a List": (json.dumps({"kind": "Deployment"}), ("not a List of Nodes",)),
    "a billion laughs": (LAUGHS, ("aliases expand to more than",)),
    "nested 100000 deep": ("[" * 100_000, ("nested deeper than",)),
    "JSON nested 200000 deep": ('{"kind": ' + "[" * 200_000 + "]" * 200_000 + "}",
                                ("is nested too deep",)),
    "JSON with Infinity": ('{"kind": "List", "items": [Infinity]}',
                           ("Infinity is not a JSON number",)),
    "JSON without a kind": ('{"items": []}', ("a document without a kind",)),
    "two documents": ("kind: List\nitems: []\n---\nkind: List\n", ("not one List",)),
    "more than 4 MiB": (" " * (5 << 20), ("larger than 4 MiB",)),
}


def _preflight(arena: Arena, *args: str) -> Result:
    return arena.run("preflight", "--mirror", f"file://{arena.scene.repo}", *args,
                     env={"TERMINATION_LOG": str(arena.termination_log)}, timeout=TIMEOUT)


def _refused(arena: Arena, run: Result, code: int, *causes: str,
             before: dict[str, object]) -> None:
    assert_refused(run, code, *causes)
    assert len(run.lines[0]) < MAX_LINE, len(run.lines[0])
    assert run.lines[0].isprintable()
    assert run.stdout == ""
    assert_untouched(before, arena.snapshot())  # type: ignore[arg-type]


@pytest.mark.parametrize("case", NODE_LISTS)
def test_a_hostile_node_list_is_exit_2_naming_the_field(arena: Arena, case: str) -> None:
    text, causes = NODE_LISTS[case]
    path = arena.scene.work / "nodes.yaml"
    path.write_text(text)
    before = arena.snapshot()
    _refused(arena, _preflight(arena, "--nodes", str(path)), 2, "error(config): ", *causes,
             before=before)


def test_a_fifo_is_never_read(arena: Arena) -> None:
    fifo = arena.scene.work / "nodes.fifo"
    os.mkfifo(fifo)
    before = arena.snapshot()
    _refused(arena, _preflight(arena, "--nodes", str(fifo)), 2, "is a FIFO", before=before)


@pytest.mark.parametrize(("args", "cause"), [
    (("--kernel", "6.1\x1b]0;owned\x07"), "\\x1b"),
    (("--kernel", f"{KERNEL},s390x"), "arch 's390x'"),
    (("--kernel", "x" * 100_000), "is not a kernel release"),
    (("--cos-build", "../../../etc"), "--cos-build"),
    (("--cos-build", "18244.151.14/../../x"), "--cos-build"),
    (("--gpu", "\u202eB200"), "--gpu"),
    (("--kernel", KERNEL, "--today", "tomorrow"), "--today"),
    (("--roll-out", KERNEL), "--roll-out changes the kernel"),
])
def test_a_hostile_flag_is_exit_2(arena: Arena, args: tuple[str, ...], cause: str) -> None:
    before = arena.snapshot()
    _refused(arena, _preflight(arena, *args), 2, cause, before=before)


def test_a_well_formed_list_of_the_same_shape_is_served(arena: Arena) -> None:
    path = arena.scene.work / "nodes.yaml"
    path.write_text(_list(_node(), _node(name="gpu-2")))
    done = _preflight(arena, "--nodes", str(path), "-o", "json")
    assert done.code == 0, done.stderr[-2000:]
    (row,) = json.loads(done.stdout)["rows"]
    assert (row["kernel"], row["state"], row["nodes"]) == (KERNEL, "ready", ["gpu-1", "gpu-2"])


def test_a_mirror_index_that_is_hostile_is_its_own_error(arena: Arena) -> None:
    (arena.scene.repo / "index.json").write_text('{"schema_version": 1, "packages": ' +
                                                 "[" * 10_000 + "]" * 10_000 + "}")
    before = arena.snapshot()
    _refused(arena, _preflight(arena, "--kernel", f"{KERNEL},x86_64"), 7,
             "preflight cannot read mirror file://", before=before)


def test_the_termination_log_is_never_written(arena: Arena) -> None:
    _preflight(arena, "--kernel", "bad kernel")
    assert not Path(arena.termination_log).exists()
