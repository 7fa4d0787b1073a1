"""The image's locks (requirements/*.txt, written by `make lock`) are current and complete:
pyproject's dependencies are all pinned by versions their specifiers allow, every pin carries
hashes (the Dockerfile installs in --require-hashes mode), and the Dockerfile installs from
them that way. A dependency added to pyproject without relocking fails here."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deploy.manifests import REPO

LOCKS = REPO / "requirements"
# The environment the image's Python is: the base's 3.11 on Linux, amd64 or arm64.
TARGETS = [{"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": machine,
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "os_name": "posix"} for machine in ("x86_64", "aarch64")]


def pins(lock: Path) -> dict[str, tuple[str, list[str], str]]:
    """name -> (version, hashes, marker) from a hash-checking requirements file."""
    text = re.sub(r"\\\n", " ", lock.read_text(encoding="utf-8"))
    found: dict[str, tuple[str, list[str], str]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *options = re.split(r"\s+(?=--)", line)
        requirement = Requirement(spec)
        (pinned,) = list(requirement.specifier)
        assert pinned.operator == "==", f"{lock.name}: {spec!r} is not pinned with =="
        hashes = [o.split("=", 1)[1] for o in options if o.startswith("--hash=")]
        assert len(options) == len(hashes), f"{lock.name}: options other than --hash: {line}"
        found[canonicalize_name(requirement.name)] = (
            pinned.version, hashes, str(requirement.marker or ""))
    return found


def _wanted(requirements: list[str]) -> list[Requirement]:
    """The requirements that apply to the image's Python (on either arch)."""
    parsed = [Requirement(r) for r in requirements]
    return [r for r in parsed if r.marker is None
            or any(r.marker.evaluate(env) for env in TARGETS)]


@pytest.mark.parametrize(("lock", "requirements"), [
    ("runtime.txt", tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
     ["dependencies"]),
    ("sbom.txt", (LOCKS / "sbom.in").read_text().split()),
])
def test_the_lock_pins_every_requirement_by_an_allowed_version(
        lock: str, requirements: list[str]) -> None:
    pinned = pins(LOCKS / lock)
    for requirement in _wanted(requirements):
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} is not in requirements/{lock}: run `make lock`"
        version = pinned[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements/{lock} pins {name}=={version}, outside {requirement.specifier}: "
            "run `make lock`")


@pytest.mark.parametrize("lock", ["runtime.txt", "sbom.txt"])
def test_every_pin_has_hashes_and_the_lock_says_how_it_was_made(lock: str) -> None:
    text = (LOCKS / lock).read_text(encoding="utf-8")
    assert "#    make lock" in text  # uv's header with the Makefile's command
    pinned = pins(LOCKS / lock)
    assert pinned
    for name, (_version, hashes, _marker) in pinned.items():
        assert hashes, f"requirements/{lock}: {name} has no --hash"
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), name


def test_the_parser_sees_a_missing_pin_and_a_missing_hash(tmp_path: Path) -> None:
    """The checks above can fail: an unpinned or unhashed line is caught."""
    lock = tmp_path / "lock.txt"
    lock.write_text("click==8.1.0\n    # via x\n")
    assert pins(lock) == {"click": ("8.1.0", [], "")}
    lock.write_text("click>=8.1 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(AssertionError, match="not pinned"):
        pins(lock)


def test_the_dockerfile_installs_from_the_locks_with_hashes_required() -> None:
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text(encoding="utf-8"))
    pip_runs = [" ".join(line.split()) for line in text.splitlines()
                if re.search(r"/opt/build/bin/pip (--python \S+ )?(install|download)", line)]
    commands = [c for run in pip_runs
                for c in re.findall(r"/opt/build/bin/pip [^&]*", run)
                if re.search(r" (install|download) ", c)]
    assert len(commands) == 3, commands  # the target's wheels, the SBOM tool, the venv
    for command in commands:
        assert "--require-hashes" in command and "--only-binary=:all:" in command, command
    assert "download" in commands[0] and "-r requirements/runtime.txt" in commands[0]
    assert "-r requirements/sbom.txt" in commands[1]
    assert "-r requirements/runtime.txt -r /self.txt" in commands[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_lock_compiles_both_locks_universally_with_hashes() -> None:
    """`make lock`, dry-run: uv for Python 3.11 on every platform, with hashes, into the two
    files the Dockerfile reads (the real run needs the index: not run here)."""
    proc = subprocess.run(["make", "-s", "-n", "-C", str(REPO), "lock", "LOCK_VENV=/nonexistent"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    commands = " ".join(proc.stdout.replace("\\\n", " ").split())
    assert "pip install -q uv==" in commands
    for output, source in (("requirements/runtime.txt", "pyproject.toml"),
                           ("requirements/sbom.txt", "requirements/sbom.in")):
        (compile_,) = re.findall(rf"/nonexistent/bin/uv pip compile [^;]*? -o {output} {source}",
                                 commands)
        for flag in ("--universal", "--python-version 3.11", "--generate-hashes"):
            assert flag in compile_, compile_
