"""docs/deploy.md keeps up with the code: the one-liner, every overlay, every exit code."""

from __future__ import annotations

import re

from deploy.manifests import OVERLAYS, REPO, render
from installer.errors import error_table

DOC = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")


def test_the_one_liner_is_documented_and_renders() -> None:
    assert "kubectl apply -k daemonset/overlays/gke-cos" in DOC
    assert render("overlays/gke-cos")


def test_every_overlay_is_described() -> None:
    for overlay in OVERLAYS:
        assert f"| `{overlay}` |" in DOC


def test_exit_code_table_covers_every_error_class() -> None:
    rows = dict(re.findall(r"^\| (\d+) \| `([a-z-]+)` \|", DOC, flags=re.MULTILINE))
    expected = {str(cls.code): cls.slug for cls in error_table()}
    assert rows == expected
    assert "../README.md#exit-codes" in DOC
