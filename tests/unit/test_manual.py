"""The manual (README.md and docs/) is complete, linked and honest.

Complete: every command (found by walking the click group, and cross-checked against the
real `--help`), option, setting and exit code is in docs/reference.md. Linked: every relative
link and anchor resolves, and README.md indexes every page. Honest: every shell block on the
getting-started pages names the test that runs it or says it needs a cluster, and the tests
named really run those commands.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from installer.cli.docs import commands, own_params
from installer.config import SETTINGS
from installer.errors import error_table

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
REFERENCE = DOCS / "reference.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
# The pages a newcomer follows first: their shell blocks must be run by a test or say that
# they need a cluster.
GETTING_STARTED = [README, DOCS / "deploy.md", DOCS / "image.md"]
SHELL_LANGS = {"sh", "bash", "console", "shell"}
NEEDS_A_CLUSTER = "# needs a cluster"
TESTED = re.compile(r"^# tested(?: [^:]*)?: (\S+)$")
README_MAX_LINES = 200


def fenced_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, first line number) of every fenced block; fences may be indented."""
    found: list[tuple[str, str, int]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^ *(`{3,}|~{3,})\s*([\w-]*)", lines[i])
        if not opening:
            i += 1
            continue
        fence, lang, start = opening.group(1), opening.group(2), i + 1
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        found.append((lang, "\n".join(body), start))
        i += 1
    return found


def outside_fences(text: str) -> list[str]:
    """The page's lines that are not inside a fenced block."""
    out: list[str] = []
    fence = None
    for line in text.splitlines():
        marker = re.match(r"^ *(`{3,}|~{3,})", line)
        if marker and (fence is None or line.strip().startswith(fence)):
            fence = None if fence else marker.group(1)
            continue
        if fence is None:
            out.append(line)
    return out


def prose(text: str) -> str:
    """The page without its fenced blocks and inline code spans (links there are not links)."""
    return "\n".join(re.sub(r"`[^`]*`", "", line) for line in outside_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, duplicates suffixed -1, -2 as GitHub does."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in outside_fences(page.read_text(encoding="utf-8")):
        match = re.match(r"^#{1,6} +(.+?) *#*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(page: Path) -> list[str]:
    text = prose(page.read_text(encoding="utf-8"))
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)


class TestSlug:
    """The anchor rules, checked on headings of the shapes the manual uses."""

    @pytest.mark.parametrize(("heading", "expected"), [
        ("Upgrade a live cluster (`live-upgrade`)", "upgrade-a-live-cluster-live-upgrade"),
        ("Rules (checked by `lint-imports` in `make lint`; contracts in pyproject.toml)",
         "rules-checked-by-lint-imports-in-make-lint-contracts-in-pyprojecttoml"),
        ("`gpu-node-installer package build`", "gpu-node-installer-package-build"),
        ("Ahead of time: `package build --cos-build`", "ahead-of-time-package-build---cos-build"),
        ("Downloads (`installer/stages/fetch/download.py`)",
         "downloads-installerstagesfetchdownloadpy"),
    ])
    def test_github_slug(self, heading: str, expected: str) -> None:
        assert slug(heading) == expected

    def test_duplicates_are_numbered(self, tmp_path: Path) -> None:
        page = tmp_path / "p.md"
        page.write_text("# A\n## Notes\n```sh\n# Notes\n```\n## Notes\n## Notes\n")
        assert anchors(page) == {"a", "notes", "notes-1", "notes-2"}


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_page_says_who_it_is_for_and_what_it_answers() -> None:
    for page in DOCS.glob("*.md"):
        opening = "\n".join(page.read_text(encoding="utf-8").splitlines()[:12])
        assert "**For:**" in opening and "**Answers:**" in opening, page.name


def test_the_readme_is_short_and_indexes_every_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for page in DOCS.glob("*.md"):
        assert f"](docs/{page.name})" in text, f"README.md does not link docs/{page.name}"
    assert "`make test` is the test command" in text
    assert "make lint && make test" in (REPO / ".ci" / "run").read_text().replace("\n", " && ")


_SHAPE = r"(\[\(.*\)\]|\(\[.*\]\)|\[\[.*\]\]|\(\(.*\)\)|\[.*\]|\(.*\)|\{.*\})"
_ARROW = re.compile(r"\s*(?:-->|---|-\.->|==>)(?:\|[^|]*\|)?\s*")


def test_the_readme_diagram_is_a_well_formed_mermaid_flowchart() -> None:
    """A structural check of the subset the diagram uses (rendering it needs a browser):
    header, balanced subgraphs, every edge between declared nodes, quoted labels."""
    (diagram,) = [body for lang, body, _ in fenced_blocks(README.read_text()) if lang == "mermaid"]
    lines = [line.strip() for line in diagram.splitlines() if line.strip()]
    assert re.fullmatch(r"(flowchart|graph) (TB|TD|BT|RL|LR)", lines[0]), lines[0]
    depth, declared, referenced = 0, set(), []
    for line in lines[1:]:
        if line == "end":
            depth -= 1
            assert depth >= 0, "an 'end' without its subgraph"
        elif line.startswith("subgraph "):
            depth += 1
            ident = re.fullmatch(r"subgraph ([A-Za-z]\w*)(\[\".*\"\])?", line)
            assert ident, line
            declared.add(ident.group(1))
        elif not re.fullmatch(r"direction (TB|TD|BT|RL|LR)", line):
            for part in _ARROW.split(line):
                node = re.fullmatch(rf"([A-Za-z]\w*){_SHAPE}?", part)
                assert node, f"not a node: {part!r} in {line!r}"
                ident, shape = node.group(1), node.group(2)
                assert ident != "end", "'end' cannot name a node"
                if shape:
                    label = shape.strip("[](){}")
                    assert label.startswith('"') and label.endswith('"'), f"unquoted: {shape}"
                    assert '"' not in label[1:-1], f"a quote inside a label: {shape}"
                    declared.add(ident)
                referenced.append(ident)
    assert depth == 0, "a subgraph is not closed"
    assert set(referenced) <= declared, f"used but never declared: {set(referenced) - declared}"


def _shell_blocks(page: Path) -> list[tuple[list[str], int]]:
    return [(body.splitlines(), line) for lang, body, line in
            fenced_blocks(page.read_text(encoding="utf-8")) if lang in SHELL_LANGS]


def _covered(node: str) -> list[str]:
    """The commands of the getting-started pages under a `# tested: NODE` marker, with
    continuation lines joined and trailing comments dropped."""
    out: list[str] = []
    for page in GETTING_STARTED:
        for lines, _ in _shell_blocks(page):
            current = None
            joined = "\n".join(lines).replace("\\\n", " ")
            for line in joined.splitlines():
                mark = TESTED.match(line.strip())
                if mark:
                    current = mark.group(1)
                elif current == node and line.strip():
                    out.append(" ".join(line.split("#", 1)[0].split()))
    return out


def _test_exists(node: str) -> bool:
    path, _, names = node.partition("::")
    source = REPO / path
    if not source.is_file() or not names:
        return False
    scope: list[ast.stmt] = ast.parse(source.read_text()).body
    for name in names.split("::"):
        found = [n for n in scope if isinstance(n, ast.FunctionDef | ast.ClassDef)
                 and n.name == name]
        if not found:
            return False
        scope = found[0].body
    return True


def test_getting_started_shell_blocks_are_tested_or_need_a_cluster() -> None:
    for page in GETTING_STARTED:
        for lines, line in _shell_blocks(page):
            where = f"{page.relative_to(REPO)}:{line}"
            marks = [m.group(1) for m in map(TESTED.match, map(str.strip, lines)) if m]
            assert marks or NEEDS_A_CLUSTER in lines, (
                f"{where}: a shell block needs '# tested: tests/...::name' or "
                f"'{NEEDS_A_CLUSTER}'")
            for node in marks:
                if node == ".ci/run":  # CI runs these very lines
                    ci = (REPO / ".ci" / "run").read_text().splitlines()
                    assert all(cmd in ci for cmd in _covered(node)), where
                else:
                    assert _test_exists(node), f"{where}: no test {node}"


def test_make_demo_runs_what_test_demo_runs() -> None:
    """`make demo` (README) is `scripts/demo.py`, which tests/kernel/test_demo.py runs;
    `make demo ARCH=arm64` passes `--arch arm64` (tests/kernel/test_arm64_demo.py)."""
    recipe = re.search(r"^demo:.*\n\t(.*)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert recipe and recipe.group(1) == \
        "$(BIN)/python scripts/demo.py $(if $(ARCH),--arch $(ARCH))"
    assert "make demo" in _covered("tests/kernel/test_demo.py::test_demo_installs_end_to_end")
    demo_test = (REPO / "tests" / "kernel" / "test_demo.py").read_text()
    assert '"scripts" / "demo.py"' in demo_test


def _make(command: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run a documented `make ...` line in the repository with this interpreter's virtualenv
    (never rebuilding it)."""
    assert command.startswith("make ")
    return subprocess.run(["make", "-s", "-C", str(REPO), "-o", "venv",
                           f"BIN={Path(sys.executable).parent}", *extra, *command.split()[1:]],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_sample_detects_the_sample_node() -> None:
    (command,) = _covered("tests/unit/test_manual.py::test_make_sample_detects_the_sample_node")
    assert command == "make sample"
    done = _make(command)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("A100") >= 8, done.stdout
    assert "cos" in done.stdout.lower()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_documented_make_image_commands() -> None:
    """image.md's `make image` lines, dry-run (`make -n`): the build they would start."""
    documented = _covered("tests/unit/test_manual.py::test_the_documented_make_image_commands")
    assert documented[0] == "make image" and len(documented) == 2
    for command in documented:
        done = _make(command, "-n", "CONTAINER_ENGINE=/usr/bin/podman")
        assert done.returncode == 0, done.stderr
        build = " ".join(done.stdout.replace("\\\n", " ").split())
        assert "/usr/bin/podman build" in build
        for assignment in command.split()[2:]:
            name, value = assignment.split("=", 1)
            expected = f"-t {value}" if name == "IMAGE" else f"--build-arg {name}={value}"
            assert expected in build, build


def _help_commands(*group: str) -> set[str]:
    done = subprocess.run([sys.executable, "-m", "installer", *group, "--help"],
                          capture_output=True, text=True, timeout=60, check=True)
    listing = done.stdout.split("Commands:", 1)[1].split("\n\n", 1)[0]
    return {line.split()[0] for line in listing.splitlines() if line.strip()}


def test_the_command_walk_finds_what_the_cli_offers() -> None:
    walked = {path for path, _ in commands()}
    top = _help_commands()
    assert {path.split()[0] for path in walked} == top
    assert {path.split()[1] for path in walked if path.startswith("package ")} == \
        _help_commands("package")


def test_every_command_option_setting_and_exit_code_is_in_the_reference() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    sections = set(re.findall(r"^### `gpu-node-installer ([a-z -]+)`$", text, re.MULTILINE))
    assert sections == {path for path, _ in commands()}, "one section per command, no more"
    for path, command in commands():
        assert f"| `{path}` |" in text, path
        for param in own_params(command):
            assert any(f"`{name}`" in text for name in (*param.opts, param.metavar or "")), \
                f"{path}: {param.opts}"
    for setting in SETTINGS:
        assert f"`{setting.flag}`" in text and f"`{setting.envvar}`" in text, setting.flag
    for cls in error_table():
        assert f"| {cls.code} | `{cls.slug}` |" in text, cls.slug


def _settings_rows(text: str) -> dict[str, list[str]]:
    block = text.split("<!-- settings-table:begin -->", 1)[1].split("<!-- settings-table:end", 1)[0]
    header, _, *rows = [line for line in block.splitlines() if line.startswith("|")]
    assert "read by" in header
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    return {row[0].strip("`"): row for row in cells}


def test_the_settings_table_names_the_commands_that_read_each_setting() -> None:
    from installer.config.readers import NODE

    rows = _settings_rows(REFERENCE.read_text(encoding="utf-8"))
    assert set(rows) == {s.flag for s in SETTINGS}, "every setting, once"
    for setting in SETTINGS:
        readers = rows[setting.flag][4]
        named = NODE if readers == "all" else set(re.findall(r"`([a-z-]+)`", readers))
        assert named == setting.commands, setting.flag


def test_the_documented_shell_completion_works() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    assert "_GPU_NODE_INSTALLER_COMPLETE=bash_source gpu-node-installer" in text
    tool = REPO / ".venv" / "bin" / "gpu-node-installer"
    env = {"PATH": "/usr/bin:/bin", "_GPU_NODE_INSTALLER_COMPLETE": "bash_source"}
    source = subprocess.run([tool], env=env, capture_output=True, text=True, timeout=5)
    assert source.returncode == 0 and "complete -o nosort -F" in source.stdout
    env |= {"_GPU_NODE_INSTALLER_COMPLETE": "bash_complete", "COMP_CWORD": "3",
            "COMP_WORDS": "gpu-node-installer install --upgrade-policy "}
    done = subprocess.run([tool], env=env, capture_output=True, text=True, timeout=5)
    assert done.stdout.split() == ["plain,refuse", "plain,evict", "plain,drain"]
