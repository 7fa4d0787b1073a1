"""One bounded, total reader for every JSON document the installer reads.

index.json, manifest.json, cache refs, `.state.json`, `.ready.json` and `.staged.json` come
from mirrors, images and the node's disk, so any of them may be hostile. `read_document`
bounds the size, the nesting depth and the length of every number before Python's json
does real work, refuses what `json.loads` lets through (NaN and Infinity, lone surrogates,
duplicate keys, control characters) and turns every failure into one `IntegrityError`
line that names the document and where it came from. Nothing else ever escapes it.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Collection
from pathlib import Path
from typing import Any, NoReturn

from installer.errors import IntegrityError

MAX_DEPTH = 16
MAX_NUMBER_CHARS = 32
MAX_STRING_CHARS = 64 * 1024
# A JSON string, or an unterminated one up to the end (possessive: linear on any input).
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_CURLY_TO_SQUARE = str.maketrans("{}", "[]")
# C0 controls, DEL, C1 controls, and surrogates (json.loads decodes lone "\ud800" escapes).
_STRICT = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_FREE_TEXT = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")  # tab allowed


class DocumentError(IntegrityError):
    """A JSON document is malformed, oversized or outside what the installer accepts."""

    default_remedy = "republish (or delete and let the installer rewrite) the named document"


class _Refused(Exception):
    """Raised inside json's hooks; turned into the caller's error class with the name."""


def read_document(data: bytes, *, name: str, source: str = "", limit: int,
                  error: type[IntegrityError] = DocumentError,
                  free_text: Collection[str] = ()) -> dict[str, Any]:
    """Decode one JSON object within every bound, or raise `error` naming name and source.

    `free_text` lists the keys whose string values are prose (a GPU's name): those may hold
    a tab; every other string (names, paths, versions, keys) holds no control character.
    """
    try:
        return _decode(data, limit, frozenset(free_text))
    except _Refused as exc:
        where = f"{name} from {source}" if source else name
        raise error(f"{where}: {exc}") from None


def read_file(path: Path, limit: int) -> bytes | None:
    """Up to `limit + 1` bytes of a regular file (so `read_document` sees an oversized one),
    None when it is absent; DocumentError when it is a directory, FIFO or unreadable (opened
    non-blocking, so a FIFO planted in its place cannot hang the run)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DocumentError(f"{path} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DocumentError(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as handle:
        return handle.read(limit + 1)


def _decode(data: bytes, limit: int, free_text: frozenset[str]) -> dict[str, Any]:
    if len(data) > limit:
        _refuse(f"more than the {limit} bytes allowed")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        _refuse(f"not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})")
    _check_depth(text)
    try:
        document = json.loads(text, object_pairs_hook=_object, parse_int=_int,
                              parse_float=_float, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        _refuse(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    except RecursionError:
        _refuse(f"nested deeper than {MAX_DEPTH} levels")
    if not isinstance(document, dict):
        _refuse(f"the top level is a JSON {type(document).__name__}, not an object")
    _check_strings(document, free_text)
    return document


def _refuse(problem: str) -> NoReturn:
    raise _Refused(problem)


def _check_depth(text: str) -> None:
    """Nesting depth from the brackets outside strings, before json recurses into it.

    Each pass removes the innermost `[]` pairs (objects are counted as arrays), so a
    document of depth d is empty after d passes; every pass is one C-speed replace.
    """
    shape = _NOT_BRACKET.sub("", _STRING.sub("", text)).translate(_CURLY_TO_SQUARE)
    if "[" * (MAX_DEPTH + 1) in shape:
        _refuse(f"nested deeper than {MAX_DEPTH} levels")
    for _ in range(MAX_DEPTH + 1):
        reduced = shape.replace("[]", "")
        if reduced == shape:  # empty, or unbalanced: json names the error if it is short
            if len(shape) > MAX_DEPTH:
                _refuse("not valid JSON: its brackets do not balance")
            return
        shape = reduced
    _refuse(f"nested deeper than {MAX_DEPTH} levels")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                _refuse(f"duplicate key {show(key)}")
            seen.add(key)
    return obj


def _int(digits: str) -> int:
    if len(digits) > MAX_NUMBER_CHARS:
        _refuse(f"a number of {len(digits)} characters (at most {MAX_NUMBER_CHARS})")
    return int(digits)


def _float(digits: str) -> float:
    if len(digits) > MAX_NUMBER_CHARS:
        _refuse(f"a number of {len(digits)} characters (at most {MAX_NUMBER_CHARS})")
    value = float(digits)
    if not math.isfinite(value):
        _refuse(f"the number {digits[:40]} is out of range")
    return value


def _constant(name: str) -> NoReturn:
    _refuse(f"{name} is not a JSON number")


def _check_strings(document: dict[str, Any], free_text: frozenset[str]) -> None:
    """Every key and string value: no surrogate, no control character (prose: tab only)."""
    stack: list[tuple[Any, str, bool]] = [(document, "", False)]
    while stack:
        value, where, prose = stack.pop()
        if isinstance(value, str):
            _check_text(value, where or "the top level", prose)
        elif isinstance(value, dict):
            for key, item in value.items():
                at = f"{where}.{key}" if where else key
                _check_text(key, f"a key in {where or 'the top level'}", False)
                stack.append((item, at, key in free_text))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", prose) for i, item in enumerate(value))


def _check_text(text: str, where: str, prose: bool) -> None:
    if len(text) > MAX_STRING_CHARS:
        _refuse(f"{show(where)}: a string of {len(text)} characters "
                f"(at most {MAX_STRING_CHARS})")
    bad = (_FREE_TEXT if prose else _STRICT).search(text)
    if bad is not None:
        kind = ("a lone surrogate" if "\ud800" <= bad.group() <= "\udfff"
                else "control characters, the first")
        _refuse(f"{show(where)} has {kind} U+{ord(bad.group()):04X}")


def show(text: str, limit: int = 80) -> str:
    """A piece of a hostile document as printable ASCII, for one-line messages."""
    return ascii(text[:limit]) + ("..." if len(text) > limit else "")
