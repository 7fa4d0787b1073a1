"""The package tree is the design picture: contracts hold, a wrong import breaks them, no
import cycles, a small top level, short modules (docs/architecture.md)."""

from __future__ import annotations

import ast
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
    ("agent/metrics/collect.py", "def _back() -> None: from installer.agent import loop",
     "installer.agent.metrics is not allowed to import installer.agent.loop"),
    ("upgrade/daemonsets.py", "from installer.upgrade.flow import Upgrade",
     "installer.upgrade.daemonsets is not allowed to import installer.upgrade.flow"),
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


# Pairs once tied in a circle, now one way (a protocol or a shared module between them):
# agent.loop -> agent.metrics, node.facts (which now holds the node's text),
# upgrade.flow -> upgrade.daemonsets, scripts/demo.py -> demo_arm64.py -> demo_shared.py.
# Every import counts here: module level, inside functions, and under TYPE_CHECKING.
ONE_WAY_FILES = [*sorted((PACKAGE / "agent").rglob("*.py")),
                 *sorted((PACKAGE / "upgrade").glob("*.py")),
                 PACKAGE / "node" / "facts.py", *sorted((REPO / "scripts").glob("demo*.py"))]


def _module(path: Path) -> str:
    """`installer.agent.metrics` for its __init__.py; a script by its file name."""
    if not path.is_relative_to(PACKAGE):
        return path.stem
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(source: str, module: str, package: bool) -> set[str]:
    """Every name `source` imports, wherever the statement is (as grimp names them)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module if package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}".rstrip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _one_way_graph(sources: dict[Path, str]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    modules = {path: _module(path) for path in sources}
    for module in modules.values():
        graph.add_module(module)
    known = set(modules.values())
    for path, source in sources.items():
        importer = modules[path]
        names = _imported(source, importer, path.name == "__init__.py")
        for name in names & known:
            # `from a import b` names a.b when it is a module, else a itself
            if name != importer and not any(n.startswith(name + ".") for n in names & known):
                graph.add_import(importer=importer, imported=name)
    return graph


def _one_way_sources() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in ONE_WAY_FILES}


def test_the_untied_pairs_run_one_way_counting_every_import() -> None:
    graph = _one_way_graph(_one_way_sources())
    for importer, imported in [("installer.agent.loop", "installer.agent.metrics"),
                               ("installer.agent.metrics.collect",
                                "installer.agent.metrics.source"),
                               ("installer.upgrade.flow", "installer.upgrade.daemonsets"),
                               ("demo", "demo_arm64"), ("demo", "demo_shared"),
                               ("demo_arm64", "demo_shared")]:
        assert graph.direct_import_exists(importer=importer, imported=imported)
    assert not (PACKAGE / "node" / "report.py").exists()  # its text lives in facts.py
    assert _cycles(graph) == []


@pytest.mark.parametrize(("file", "back", "cycle"), [
    ("installer/agent/metrics/collect.py",
     "if TYPE_CHECKING:\n    from installer.agent.loop import Agent\n",
     ["installer.agent.loop", "installer.agent.metrics", "installer.agent.metrics.collect"]),
    ("installer/upgrade/daemonsets.py",
     "def _back() -> None:\n    from installer.upgrade import flow\n",
     ["installer.upgrade.daemonsets", "installer.upgrade.flow"]),
    ("scripts/demo_arm64.py", "def _back() -> None:\n    import demo\n",
     ["demo", "demo_arm64"]),
    ("scripts/demo_shared.py", "from demo_arm64 import main_arm64\n",
     ["demo_arm64", "demo_shared"]),
])
def test_a_back_import_closes_a_cycle(file: str, back: str, cycle: list[str]) -> None:
    sources = _one_way_sources()
    sources[REPO / file] += "\n" + back
    assert _cycles(_one_way_graph(sources)) == [cycle]


def test_top_level_is_small_and_modules_are_short() -> None:
    entries = [p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"]
    # the six rooms of design.md, the edges, and one room per subsystem (upgrade, agent)
    assert len(entries) <= 16, sorted(entries)
    long = {str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}
