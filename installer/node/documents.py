"""One bounded, total loader for every JSON and YAML document the installer reads.

index.json, manifest.json, cache refs, `.state.json`, `.ready.json` and `.staged.json` come
from mirrors, images and the node's disk; workload manifests, `--node-labels`, MIG configs
and `--aliases-from` from operators: any of them may be hostile. `read_document` bounds the
size, the nesting depth and the length of every number before Python's json does real work,
refuses what `json.loads` lets through (NaN and Infinity, lone surrogates, duplicate keys,
control characters) and turns every failure into one line of the caller's error class (an
`IntegrityError` by default) that names the document and where it came from. `read_yaml`
bounds a YAML stream's nesting depth, alias uses and alias expansion from the parser's
events, before any Python object is built. Files come through `installer.node.files`.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from installer.errors import InstallerError, IntegrityError
from installer.node.files import read_regular

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
_ANY_TEXT = re.compile(r"[\ud800-\udfff]")  # a lone surrogate: not even UTF-8 can carry it


class DocumentError(IntegrityError):
    """A JSON document is malformed, oversized or outside what the installer accepts."""

    default_remedy = "republish (or delete and let the installer rewrite) the named document"


class _Refused(Exception):
    """Raised inside json's hooks; turned into the caller's error class with the name."""


def read_document(data: bytes, *, name: str, source: str = "", limit: int,
                  error: type[InstallerError] = DocumentError,
                  free_text: Collection[str] = (), any_text: bool = False) -> dict[str, Any]:
    """Decode one JSON object within every bound, or raise `error` naming name and source.

    `free_text` lists the keys whose string values are prose (a GPU's name): those may hold
    a tab; every other string (names, paths, versions, keys) holds no control character.
    `any_text`: every string may hold any character but a lone surrogate (a view the
    installer wrote itself, whose messages may span lines).
    """
    try:
        return _decode(data, limit, frozenset(free_text), any_text)
    except _Refused as exc:
        where = f"{name} from {source}" if source else name
        raise error(f"{where}: {exc}") from None


def read_json_file(path: Path, *, limit: int, name: str | None = None,
                   error: type[InstallerError] = DocumentError,
                   free_text: Collection[str] = (), any_text: bool = False
                   ) -> dict[str, Any] | None:
    """A JSON object from a regular file of at most `limit` bytes, None when it is absent;
    `error` naming the file (`name`, else the path) for anything else."""
    data = read_regular(path, limit, error=error, name=name or str(path), oversize=False)
    return None if data is None else read_document(
        data, name=name or str(path), limit=limit, error=error, free_text=free_text,
        any_text=any_text)


def read_file(path: Path, limit: int) -> bytes | None:
    """Up to `limit + 1` bytes of a regular file (so `read_document` sees an oversized one),
    None when it is absent; DocumentError when it is a directory, FIFO, device, socket or
    unreadable (`installer.node.files`: opened non-blocking, so nothing there can hang the
    run)."""
    return read_regular(path, limit, error=DocumentError, oversize=False)


def _decode(data: bytes, limit: int, free_text: frozenset[str],
            any_text: bool = False) -> dict[str, Any]:
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
    _check_strings(document, free_text, any_text)
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


def _check_strings(document: dict[str, Any], free_text: frozenset[str],
                   any_text: bool) -> None:
    """Every key and string value: no surrogate, no control character (prose: tab only)."""
    stack: list[tuple[Any, str, bool]] = [(document, "", False)]
    while stack:
        value, where, prose = stack.pop()
        if isinstance(value, str):
            _check_text(value, where or "the top level", _ANY_TEXT if any_text
                        else _FREE_TEXT if prose else _STRICT)
        elif isinstance(value, dict):
            for key, item in value.items():
                at = f"{where}.{key}" if where else key
                _check_text(key, f"a key in {where or 'the top level'}",
                            _ANY_TEXT if any_text else _STRICT)
                stack.append((item, at, key in free_text))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", prose) for i, item in enumerate(value))


def _check_text(text: str, where: str, refused: re.Pattern[str]) -> None:
    if len(text) > MAX_STRING_CHARS:
        _refuse(f"{show(where)}: a string of {len(text)} characters "
                f"(at most {MAX_STRING_CHARS})")
    bad = refused.search(text)
    if bad is not None:
        kind = ("a lone surrogate" if "\ud800" <= bad.group() <= "\udfff"
                else "control characters, the first")
        _refuse(f"{show(where)} has {kind} U+{ord(bad.group()):04X}")


def show(text: str, limit: int = 80) -> str:
    """A piece of a hostile document as printable ASCII, for one-line messages."""
    return ascii(text[:limit]) + ("..." if len(text) > limit else "")


_BOUNDED = reprlib.Repr()  # keyword arguments only from Python 3.12
_BOUNDED.maxlevel, _BOUNDED.maxstring, _BOUNDED.maxlong, _BOUNDED.maxother = 2, 60, 40, 60
_BOUNDED.maxdict = _BOUNDED.maxlist = _BOUNDED.maxtuple = _BOUNDED.maxset = 4


def quote(value: object, limit: int = 80) -> str:
    """Any parsed value (a string, a 4 MiB list, a 5000-digit int) as a bounded, printable
    prefix: error lines quote what they refuse, never the whole of it."""
    if isinstance(value, str):
        return show(value, limit)
    try:
        shown = ascii(_BOUNDED.repr(value))[1:-1]  # Python's own notation, not quoted again
    except ValueError:  # an int past Python's 4300-digit str() limit, however deep
        return "<a number too long to show>"
    return shown[:limit] + ("..." if len(shown) > limit else "")


# YAML: what the API server's own YAML reader (go-yaml) allows a document to expand to, and
# deeper nesting than any Kubernetes object or mig-parted file holds.
YAML_MAX_DEPTH = 100
YAML_MAX_ALIASES = 10_000
YAML_MAX_EXPANSION = 400_000


_YAML_REMEDY = "give the document itself, not one built to expand (aliases) or nest without end"


@dataclass
class YamlBudget:
    """What is left to spend of the bounds, shared by the documents of one input."""

    expansion: int = YAML_MAX_EXPANSION
    aliases: int = YAML_MAX_ALIASES


def read_yaml(text: str | bytes, *, name: str, error: type[InstallerError],
              budget: YamlBudget | None = None) -> list[Any]:
    """Every document of a YAML (or JSON) stream, built only once its shape is bounded.

    Nesting deeper than YAML_MAX_DEPTH, more than YAML_MAX_ALIASES alias uses, aliases that
    expand to more than YAML_MAX_EXPANSION nodes (a "billion laughs" document) or an
    alias inside the node it names (a recursive document) is `error` naming `name` and the
    limit; the pieces of one input, read one by one, share one `budget`. A syntax error is
    left to the loader: `yaml.YAMLError` (with its mark) comes out as it is, for the caller
    to say where; so does a value the safe constructor cannot build (ValueError, TypeError,
    OverflowError)."""
    import yaml  # type: ignore[import-untyped]

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # both are safe loaders
    try:
        _check_yaml(yaml.parse(text, Loader=loader), yaml, budget or YamlBudget())
    except _Refused as exc:
        raise error(f"{name}: {exc}", remedy=_YAML_REMEDY) from None
    except yaml.YAMLError as exc:  # the same error comes out of the loader, with its mark
        if "nesting depth" in str(exc):  # libyaml's own bound on flow nesting
            raise error(f"{name}: nested deeper than {YAML_MAX_DEPTH} levels",
                        remedy=_YAML_REMEDY) from None
    return [document for document in yaml.load_all(text, Loader=loader)
            if document is not None]


def _check_yaml(events: Any, yaml: Any, budget: YamlBudget) -> None:
    """Depth, alias uses and what aliases expand to, from the parser's events (no recursion,
    no Python objects). Each anchor's size is what its node expands to, so an alias counts
    as its whole subtree: nine levels of nine aliases each count as 9**9 nodes, refused
    before the sixth level is read."""
    depth = nodes = 0
    sizes: dict[str, int] = {}
    opened: list[tuple[str | None, int]] = []  # (anchor, nodes before it) per open node
    for event in events:
        if isinstance(event, yaml.ScalarEvent):
            nodes += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            budget.aliases -= 1
            if budget.aliases < 0:
                _refuse(f"more than {YAML_MAX_ALIASES} alias uses (*name)")
            if any(anchor == event.anchor for anchor, _ in opened):
                _refuse(f"the alias *{show(event.anchor or '', 40)} is inside the node it "
                        "names (a recursive document)")
            size = sizes.get(event.anchor or "", 1)
            nodes += size
            budget.expansion -= size
            if budget.expansion < 0:
                _refuse(f"its aliases expand to more than {YAML_MAX_EXPANSION} nodes")
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > YAML_MAX_DEPTH:
                _refuse(f"nested deeper than {YAML_MAX_DEPTH} levels")
            opened.append((event.anchor, nodes))
            nodes += 1
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            anchor, before = opened.pop()
            if anchor is not None:
                sizes[anchor] = nodes - before
        elif isinstance(event, yaml.DocumentEndEvent):
            sizes.clear()  # anchors belong to one document

