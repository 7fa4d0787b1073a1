"""docs/*.schema.json agree with the parsers: what the installer accepts, the schema accepts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from installer.packages.manifest import ManifestError, manifest_from_dict
from installer.packages.repository import IndexFormatError, parse_index
from tests.unit.test_package import BAD_MANIFESTS, mutate, valid
from tests.unit.test_repository import index_doc

DOCS = Path(__file__).parents[2] / "docs"
SEMANTIC = ("duplicate", "must come before", "not a file of kind", "both a file",
            "must name a file of the package")


def schema(name: str) -> jsonschema.Draft202012Validator:
    document = json.loads((DOCS / name).read_text())
    jsonschema.Draft202012Validator.check_schema(document)
    return jsonschema.Draft202012Validator(document)


MANIFEST = schema("manifest.schema.json")
INDEX = schema("index.schema.json")


def test_valid_documents_pass() -> None:
    MANIFEST.validate(valid())
    INDEX.validate(index_doc())


@pytest.mark.parametrize(("path", "value", "message"),
                         [case for case in BAD_MANIFESTS if not any(
                             word in case[2] for word in SEMANTIC)],
                         ids=lambda v: str(v)[:24])
def test_schema_refuses_what_the_parser_refuses(path: str, value: Any, message: str) -> None:
    assert not MANIFEST.is_valid(mutate(path, value))


@given(st.sampled_from([case[0] for case in BAD_MANIFESTS]),
       st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12),
                 st.lists(st.text(max_size=4), max_size=2)))
@settings(max_examples=300)
def test_parser_accepts_only_schema_valid_manifests(path: str, value: Any) -> None:
    doc = mutate(path, value)
    try:
        manifest_from_dict(doc)
    except ManifestError:
        return
    MANIFEST.validate(doc)


@given(st.dictionaries(st.sampled_from(["default", "latest", "535", "x"]),
                       st.one_of(st.text(max_size=10), st.integers()), max_size=3))
def test_index_aliases_agree(aliases: dict[str, Any]) -> None:
    doc = index_doc(aliases=aliases)
    try:
        parse_index(json.dumps(doc).encode())
    except IndexFormatError:
        assert not INDEX.is_valid(doc)
        return
    INDEX.validate(doc)
