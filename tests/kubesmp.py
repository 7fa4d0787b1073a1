"""Kubernetes' strategic merge patch, the part the Node status subresource uses (the fake
API server's PATCH /api/v1/nodes/<n>/status, tests/kubefake.py): `status.conditions` (and
`addresses`) merge by their key `type`, an element `{"type": t, "$patch": "delete"}` removes
that element, any other list is replaced, nested maps merge; anything else is refused as
the real API server refuses it (400)."""

from __future__ import annotations

import copy
from typing import Any

SMP = "application/strategic-merge-patch+json"
_MERGE_KEYS = {"conditions": "type", "addresses": "type"}


class PatchRefused(Exception):
    """The real API server would refuse this patch (400)."""


def strategic_merge(target: Any, patch: Any, key: str = "") -> Any:
    """The part of Kubernetes' strategic merge patch the Node status uses (see above)."""
    if isinstance(patch, list) and key in _MERGE_KEYS:
        return _merge_list(target if isinstance(target, list) else [], patch, _MERGE_KEYS[key])
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if name.startswith("$"):
            raise PatchRefused(f"unsupported directive {name!r}")
        if value is None:
            result.pop(name, None)
        else:
            result[name] = strategic_merge(result.get(name), value, name)
    return result


def _merge_list(target: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    result = copy.deepcopy(target)
    for element in patch:
        if not isinstance(element, dict) or merge_key not in element:
            raise PatchRefused(f"map: {element!r} does not contain declared merge key: "
                               f"{merge_key}")
        at = next((i for i, e in enumerate(result) if e.get(merge_key) == element[merge_key]),
                  None)
        directive = element.get("$patch")
        if directive == "delete":
            if set(element) != {merge_key, "$patch"}:
                raise PatchRefused(f"a $patch: delete element holds more than its key: {element}")
            if at is not None:
                result.pop(at)
            continue
        if directive is not None:
            raise PatchRefused(f"unsupported $patch {directive!r}")
        merged = strategic_merge(result[at] if at is not None else {}, element)
        if at is None:
            result.append(merged)
        else:
            result[at] = merged
    return result
