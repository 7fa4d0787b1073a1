"""Kernel module parameters, held to the syntax the kernel parses them with.

finit_module(2) gets one string, `key=value key=value`, which the kernel's parse_args()
cuts with next_arg() (lib/cmdline.c, kernel/params.c): whitespace outside double quotes ends a
parameter, the first `=` separates key from value, a `"` anywhere toggles quoting and one pair
of quotes around a value is dropped. A value holding whitespace or a quote could therefore
carry a second parameter (`NVreg_X=1 NVreg_Y=2`) or swallow the next one.

Chosen: a value is printable ASCII without whitespace, `"` or `'`, so it never needs quoting
and the string the kernel sees splits back into exactly the pairs given; a value that needs a
space is refused rather than quoted. A `=` inside a value stays literal (next_arg() splits at
the first one): `NVreg_RegistryDwords=PowerMizerEnable=0x1;PerfLevelSrc=0x2222` is one value.
Keys are `[A-Za-z0-9_]`, module names also `-` (the kernel reads `-` and `_` alike).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from installer.config.values import Invalid, visible

_MODULE = r"[A-Za-z0-9_-]{1,55}"  # MODULE_NAME_LEN is 56 with the NUL
_KEY = r"[A-Za-z0-9_]{1,64}"
_VALUE = r"[!#-&(-~]{0,256}"  # printable ASCII but space, '"' and "'"
_PARAM_RE = re.compile(rf"({_MODULE})\.({_KEY})=({_VALUE})")
_KEY_RE = re.compile(_KEY)
_VALUE_RE = re.compile(_VALUE)
FILE_LIMIT = 1 << 20


@dataclass(frozen=True)
class ModuleParam:
    """`nvidia.NVreg_EnableMSI=0`: one kernel module parameter set by the operator."""

    module: str
    key: str
    value: str


def parse_module_param(value: str) -> ModuleParam:
    """`module.key=value`; the module name is normalised ('-' -> '_') as the kernel does."""
    match = _PARAM_RE.fullmatch(visible(value).strip(" "))
    if not match:
        raise Invalid(value)
    return ModuleParam(match.group(1).replace("-", "_"), match.group(2), match.group(3))


def check_param(key: str, value: str) -> None:
    """Invalid unless `key=value` reaches the kernel as exactly this one pair."""
    if not _KEY_RE.fullmatch(key):
        raise Invalid(key, f"the name {key!r} is not [A-Za-z0-9_], 1 to 64 characters")
    if not _VALUE_RE.fullmatch(value):
        raise Invalid(value, f"the value {value!r} is not printable ASCII without spaces "
                             "or quotes (at most 256 characters)")


def read_params_file(path: Path) -> list[ModuleParam]:
    """`module.key=value` lines; blank lines and '#' comments are ignored.

    Invalid (with the line number as its reason) for a line that is not one parameter, a
    file that is not UTF-8 text, larger than 1 MiB or unreadable.
    """
    try:
        with path.open("rb") as handle:
            data = handle.read(FILE_LIMIT + 1)
    except OSError as exc:
        raise Invalid(str(path), f"it cannot be read ({exc.strerror})") from None
    if len(data) > FILE_LIMIT:
        raise Invalid(str(path), f"it is larger than {FILE_LIMIT >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Invalid(str(path), f"it is not UTF-8 text (byte {exc.start})") from None
    params = []
    for number, line in enumerate(text.split("\n"), start=1):
        item = line.split("#", 1)[0].strip(" \t\r")
        if not item:
            continue
        try:
            params.append(parse_module_param(item))
        except Invalid:
            raise Invalid(str(path), f"line {number}: {item!r} is not module.key=value "
                                     "(no spaces or quotes in the value)") from None
    return params
