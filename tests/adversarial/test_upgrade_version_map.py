"""DRIVER_VERSION_MAP files a careless or hostile operator mounts, through the real CLI.

Each bad map is refused at start: exit 2, one line naming the entry (or the file) and what
is wrong, no traceback, and the arena unchanged: the map is read before anything is written
and before the API is asked (installer/upgrade/versionmap.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adversarial.harness import VERSION, Arena, Result, refused_untouched

NODE = "gpu-node-1"
# the simulated kernel's own bookkeeping, written when the fake node starts (mirrorkit's
# SIMULATED): not the installer's doing; nothing else may change
SIMULATED = ("node/proc/.fake-kernel.json", "node/proc/devices")
POOL = "cloud.google.com/gke-nodepool"


def _install(arena: Arena, map_path: Path, *flags: str, env: dict[str, str] | None = None
             ) -> Result:
    """`install` with the map (and a node name, which the map needs); no API server."""
    return arena.run("install", *arena.args(), "--driver-version", VERSION,
                     "--mirror", f"file://{arena.scene.repo}", "--node-name", NODE,
                     "--service-account-dir", str(arena.scene.work / "no-account"),
                     "--driver-version-map", str(map_path), *flags,
                     env={"TERMINATION_LOG": str(arena.termination_log), **(env or {})})


def _map(arena: Arena, text: str) -> Path:
    path = arena.scene.work / "version-map.yaml"
    path.write_text(text)
    return path


LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n"
    for i in range(8))

# (id, map text, the texts the one line must hold)
BAD_MAPS = [
    ("not-yaml", "- selector: {a: b\n", ("DRIVER_VERSION_MAP is not valid YAML",)),
    ("not-a-list", f"{POOL}: h200-pool\n", ("DRIVER_VERSION_MAP is a dict, not a list",)),
    ("two-documents", "- {selector: {a: b}, version: '570'}\n---\n- x\n",
     ("2 YAML documents",)),
    ("entry-not-a-mapping", "- 570\n", ("entry 1 is 570, not a mapping",)),
    ("unknown-key", f"- selector: {{{POOL}: a}}\n  versoin: '570'\n",
     ("entry 1 has unknown key 'versoin'",)),
    ("empty-selector", "- selector: {}\n  version: '570'\n",
     ("entry 1 has an empty or missing selector",)),
    ("missing-selector", "- version: '570'\n", ("entry 1 has an empty or missing selector",)),
    ("selector-not-a-mapping", "- selector: [a, b]\n  version: '570'\n",
     ("entry 1 has an empty or missing selector",)),
    ("bad-version-second-entry",
     f"- {{selector: {{{POOL}: a}}, version: '570'}}\n"
     f"- {{selector: {{{POOL}: b}}, version: 570.x}}\n",
     ("entry 2 version '570.x' is not",)),
    ("float-version", f"- {{selector: {{{POOL}: a}}, version: 570.1}}\n",
     ("entry 1 version 570.1 is not a branch or version (quote it)",)),
    ("missing-version", f"- {{selector: {{{POOL}: a}}}}\n", ("entry 1 has no version",)),
    ("version-with-shell", f"- {{selector: {{{POOL}: a}}, version: '570; rm -rf /'}}\n",
     ("entry 1 version '570; rm -rf /' is not",)),
    ("bad-flavour", f"- {{selector: {{{POOL}: a}}, version: '570', flavour: closed}}\n",
     ("entry 1 flavour 'closed' is not one of auto, open, proprietary",)),
    ("bad-label-key", "- {selector: {'bad key!': a}, version: '570'}\n",
     ("entry 1 selector key 'bad key!' is not a label key",)),
    ("bool-label-value", f"- {{selector: {{{POOL}: yes}}, version: '570'}}\n",
     ("entry 1 selector value True", "quote numbers and booleans")),
    ("label-value-too-long", f"- {{selector: {{{POOL}: {'x' * 64}}}, version: '570'}}\n",
     ("entry 1 selector value", "is not a label value")),
    ("billion-laughs", LAUGHS, ("DRIVER_VERSION_MAP",)),
    ("deep-nesting", "- " + "[" * 40 + "]" * 40 + "\n", ("DRIVER_VERSION_MAP",)),
]


@pytest.mark.parametrize(("text", "causes"), [c[1:] for c in BAD_MAPS],
                         ids=[c[0] for c in BAD_MAPS])
def test_a_bad_map_is_refused_at_start_naming_the_entry(arena: Arena, text: str,
                                                       causes: tuple[str, ...]) -> None:
    path = _map(arena, text)
    done = refused_untouched(arena, lambda: _install(arena, path), 2, *causes,
                             allowed=SIMULATED)
    assert done.lines[0].startswith("error(config): DRIVER_VERSION_MAP")


def test_a_missing_map_file_is_refused(arena: Arena) -> None:
    missing = arena.scene.work / "absent.yaml"
    refused_untouched(arena, lambda: _install(arena, missing), 2, str(missing),
                      "does not exist", allowed=SIMULATED)


def test_a_map_that_is_a_fifo_is_refused_without_blocking(arena: Arena) -> None:
    fifo = arena.scene.work / "fifo.yaml"
    os.mkfifo(fifo)
    refused_untouched(arena, lambda: _install(arena, fifo), 2, str(fifo), allowed=SIMULATED)


def test_an_oversized_map_is_refused(arena: Arena) -> None:
    path = _map(arena, "# padding\n" * 30000)
    refused_untouched(arena, lambda: _install(arena, path), 2, str(path), allowed=SIMULATED)


def test_the_map_needs_the_node_name(arena: Arena) -> None:
    path = _map(arena, f"- {{selector: {{{POOL}: a}}, version: '570'}}\n")

    def run() -> Result:
        return arena.run("install", *arena.args(), "--driver-version", VERSION,
                         "--driver-version-map", str(path),
                         env={"TERMINATION_LOG": str(arena.termination_log)})

    refused_untouched(arena, run, 2, "DRIVER_VERSION_MAP needs this node's name", allowed=SIMULATED)


def test_a_good_map_without_an_api_is_refused_not_guessed(arena: Arena) -> None:
    """Without the Node's labels, the pool's version is unknown: installing the global
    version instead could put the wrong driver on a pool."""
    path = _map(arena, f"- {{selector: {{{POOL}: a}}, version: '570'}}\n")
    refused_untouched(arena, lambda: _install(arena, path), 2,
                      "DRIVER_VERSION_MAP needs the Kubernetes API", allowed=SIMULATED)


@pytest.mark.parametrize("command", ["fetch", "versions", "load", "stage"])
def test_every_command_that_fetches_refuses_a_bad_map(arena: Arena, command: str) -> None:
    path = _map(arena, f"- {{selector: {{{POOL}: a}}, version: '570', pool: a}}\n")

    def run() -> Result:
        return arena.run(command, *arena.args(), "--mirror", f"file://{arena.scene.repo}",
                         "--node-name", NODE, "--driver-version-map", str(path),
                         env={"TERMINATION_LOG": str(arena.termination_log)})

    refused_untouched(arena, run, 2, "DRIVER_VERSION_MAP entry 1 has unknown key 'pool'",
                      allowed=SIMULATED)
