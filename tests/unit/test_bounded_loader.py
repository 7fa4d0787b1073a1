"""The one YAML/JSON loader and the one file reader, without a subprocess.

The issue's bound for an exploding document is one second; the loader refuses the classic
ones in a few milliseconds, so the assertion below keeps a wide margin.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from installer.errors import ConfigError
from installer.node.documents import (
    YAML_MAX_EXPANSION,
    DocumentError,
    YamlBudget,
    quote,
    read_document,
    read_json_file,
    read_yaml,
)
from installer.node.files import read_regular

LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi",
                                                               strict=True))


@pytest.mark.parametrize(("text", "limit"), [
    (LAUGHS, f"aliases expand to more than {YAML_MAX_EXPANSION} nodes"),
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 100 levels"),
    ("{a: " * 100_000 + "1" + "}" * 100_000, "nested deeper than 100 levels"),
])
def test_exploding_yaml_ends_within_a_second(text: str, limit: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ConfigError) as caught:
        read_yaml(text, name="f.yaml", error=ConfigError)
    assert time.perf_counter() - started < 1.0
    assert caught.value.message.startswith("f.yaml: ") and limit in caught.value.message


def test_anchors_within_bounds_still_load() -> None:
    """Merge keys and shared anchors, as hand-written configs use them, are read as ever."""
    text = "base: &b {gpu: 1, mem: 2}\nx: {<<: *b, mem: 3}\ny: *b\n---\nz: 1\n"
    assert read_yaml(text, name="f", error=ConfigError) == [
        {"base": {"gpu": 1, "mem": 2}, "x": {"gpu": 1, "mem": 3}, "y": {"gpu": 1, "mem": 2}},
        {"z": 1}]


def test_one_budget_spans_the_pieces_of_an_input() -> None:
    budget = YamlBudget()
    piece = f"a: &a [{','.join(['1'] * 100)}]\nb: [{','.join(['*a'] * 100)}]\n"
    for _ in range(YAML_MAX_EXPANSION // 10_100):  # each piece expands 100 lists of 101
        read_yaml(piece, name="f", error=ConfigError, budget=budget)
    with pytest.raises(ConfigError, match="aliases expand to more than"):
        for _ in range(100):
            read_yaml(piece, name="f", error=ConfigError, budget=budget)


def test_json_view_may_hold_any_text_but_stays_bounded() -> None:
    assert read_document(b'{"m": "two\\nlines"}', name="v", limit=100,
                         any_text=True) == {"m": "two\nlines"}
    with pytest.raises(DocumentError, match="control characters"):
        read_document(b'{"m": "two\\nlines"}', name="v", limit=100)
    with pytest.raises(DocumentError, match="lone surrogate"):
        read_document(b'{"m": "\\ud800"}', name="v", limit=100, any_text=True)
    with pytest.raises(DocumentError, match="nested deeper"):
        read_document(b"[" * 5000 + b"]" * 5000, name="v", limit=100_000, any_text=True)


@pytest.mark.parametrize(("make", "kind"), [
    (os.mkfifo, "a FIFO (named pipe)"),
    (lambda p: os.mknod(p, stat.S_IFSOCK | 0o600), "a socket"),
    (os.mkdir, "a directory"),
])
def test_reader_names_what_is_not_a_file(tmp_path: Path, make: object, kind: str) -> None:
    path = tmp_path / "doc.json"
    make(path)  # type: ignore[operator]
    with pytest.raises(ConfigError) as caught:
        read_regular(path, 100, error=ConfigError)
    assert caught.value.message == f"{path} is {kind}, not a regular file"


def test_reader_limits_and_absence(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    assert read_regular(path, 10, error=ConfigError) is None
    assert read_regular(tmp_path / "file" / "below", 10, error=ConfigError) is None
    path.write_bytes(b"x" * 11)
    with pytest.raises(ConfigError, match=r"doc.json is larger than 10 bytes \(the limit\)"):
        read_regular(path, 10, error=ConfigError)
    assert read_regular(path, 10, error=ConfigError, oversize=False) == b"x" * 11
    path.write_bytes(b'{"a": 1}')
    assert read_json_file(path, limit=100) == {"a": 1}


@pytest.mark.parametrize(("value", "shown"), [
    ("x" * 10_000, "'" + "x" * 80 + "'..."),
    (list(range(1_000_000)), "[0, 1, 2, 3, ...]"),
    ({"a": [1, [2, [3]]]}, "{'a': [1, [...]]}"),
    (7, "7"),
    (True, "True"),
    ("\x1b[31m\u202e", "'\\x1b[31m\\u202e'"),
])
def test_quote_shows_a_bounded_printable_prefix(value: object, shown: str) -> None:
    assert quote(value) == shown


def test_quote_survives_a_number_past_pythons_digit_limit() -> None:
    assert quote([10 ** 5000]) == "<a number too long to show>"
