"""The manifest's `modules`: kernel modules in load order, with their default parameters.

A default parameter is held to the same kernel syntax (`next_arg()`) as the operator's
(`installer.config.modparams`): a value like `1 NVreg_Y=2` would reach finit_module as two
parameters, so such a package is refused when its manifest is validated, before a byte of
it is cached.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from installer.config.modparams import check_param
from installer.config.values import Invalid

Fail = Callable[[str, str], Exception]
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,63}$")
_KEYS = {"name", "file", "depends", "params"}


@dataclass(frozen=True)
class ModuleEntry:
    """A kernel module of the package, in load order, with what it needs loaded first."""

    name: str
    file: str
    depends: tuple[str, ...]
    params: dict[str, str] = field(default_factory=dict)


def parse_modules(value: Any, module_files: set[str], fail: Fail, where: str = "modules"
                  ) -> tuple[ModuleEntry, ...]:
    """Validate the list: known keys, names, a file of kind 'module', load order."""
    if not isinstance(value, list):
        raise fail(where, "must be a list")
    modules = tuple(_module(item, f"{where}[{i}]", module_files, fail)
                    for i, item in enumerate(value))
    names = [_norm(module.name) for module in modules]
    for i, module in enumerate(modules):
        if _norm(module.name) in names[:i]:
            raise fail(f"{where}[{i}].name", f"duplicate module {module.name!r}")
        later = [dep for dep in module.depends if _norm(dep) in names[i:]]
        if later:
            raise fail(f"{where}[{i}].depends", f"{later[0]!r} must come before "
                       f"{module.name!r} (modules are listed in load order)")
    return modules


def _module(obj: Any, where: str, module_files: set[str], fail: Fail) -> ModuleEntry:
    if not isinstance(obj, dict):
        raise fail(where, "must be a JSON object")
    if obj.keys() != _KEYS:
        missing, unknown = sorted(_KEYS - obj.keys()), sorted(obj.keys() - _KEYS)
        raise fail(where, f"missing {', '.join(missing)}" if missing
                   else f"unknown field {', '.join(unknown)}")
    name = _name(obj["name"], f"{where}.name", fail)
    file = obj["file"]
    if not isinstance(file, str) or file not in module_files:
        raise fail(f"{where}.file", f"{str(file)[:80]!r} is not a file of kind 'module'")
    depends = obj["depends"]
    if not isinstance(depends, list):
        raise fail(f"{where}.depends", "must be a list of module names")
    for i, dep in enumerate(depends):
        _name(dep, f"{where}.depends[{i}]", fail)
    return ModuleEntry(name, file, tuple(depends), _params(obj["params"], where, name, fail))


def _name(value: Any, where: str, fail: Fail) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise fail(where, f"{str(value)[:80]!r} must be a kernel module name")
    return value


def _params(params: Any, where: str, module: str, fail: Fail) -> dict[str, str]:
    """Each default parameter reaches the kernel as exactly the one pair written."""
    if not isinstance(params, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
        raise fail(f"{where}.params", "must map parameter names to strings")
    for key, value in params.items():
        try:
            check_param(key, value)
        except Invalid as exc:
            raise fail(f"{where}.params", f"default parameter {module}.{key} is refused: "
                       f"{exc.reason}") from None
    return dict(params)


def _norm(name: str) -> str:
    return name.replace("-", "_")
