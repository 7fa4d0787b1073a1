"""The package tree is the design picture: contracts hold, a wrong import breaks them, no
import cycles, a small top level, short modules (docs/architecture.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "installer"


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over the `installer` package found in `tree` (not the editable install:
    -S keeps site's .pth finders out, so the copy in `tree` is the one analysed)."""
    code = "import sys; from importlinter.cli import lint_imports_command; " \
           "sys.exit(lint_imports_command())"
    env = {"PYTHONPATH": f"{tree}:{sysconfig.get_paths()['purelib']}", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-S", "-c", code], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(PACKAGE, tree / "installer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tree)
    return tree


def test_contracts_hold(tmp_path: Path) -> None:
    done = _lint_imports(_copy(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("stages/verify/nvml.py", "from installer.stages import fetch",
     "installer.stages.verify is not allowed to import installer.stages.fetch"),
    ("packages/cache.py", "from installer.pipeline import runner",
     "installer.packages.cache -> installer.pipeline.runner"),
    ("errors.py", "from installer import config",
     "installer.errors is not allowed to import installer.config"),
])
def test_a_wrong_import_breaks_a_contract(tmp_path: Path, module: str, line: str,
                                          broken: str) -> None:
    tree = _copy(tmp_path)
    with (tree / "installer" / module).open("a") as handle:
        handle.write(f"\n{line}  # noqa: E402,F401\n")
    done = _lint_imports(tree)
    assert done.returncode == 1
    assert broken in done.stdout


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_no_import_cycles_counting_imports_inside_functions() -> None:
    graph = grimp.build_graph("installer", exclude_type_checking_imports=True)
    assert len(graph.modules) > 50
    assert _cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="a")
    graph.add_import(importer="b", imported="c")
    assert _cycles(graph) == [["a", "b"]]


def test_top_level_is_small_and_modules_are_short() -> None:
    entries = [p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"]
    # the six rooms of design.md, the edges, and one room per subsystem (upgrade, agent)
    assert len(entries) <= 16, sorted(entries)
    long = {str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}
