"""Which Xids are critical: the setting's parser and the two lists it is checked against.

GKE's device plugin sets its `XidCriticalError` node condition for Xids 48, 63, 64, 79,
119, 120, 123 and 140 and always treats 48 (a double-bit ECC error) as critical; that is
our default, and 48 stays critical whatever the setting says. NVIDIA's device plugin
ignores the application errors 13, 31, 43, 45, 68 and 109 (a CUDA program's own fault, the
GPU is fine): naming one of those here is refused, so a node is never marked broken by a
user's bad kernel. The setting is a row of the one table in `installer.config`.
"""

from __future__ import annotations

import re

from installer.config.values import Invalid, integer

ALWAYS_CRITICAL = 48  # double-bit ECC error: GKE's device plugin always marks it
GKE_CRITICAL = (48, 63, 64, 79, 119, 120, 123, 140)  # GKE's XidCriticalError set
# NVIDIA's device plugin: application errors, never a sign of a bad GPU
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
MAX_XID = 999
DEFAULT = ",".join(str(code) for code in GKE_CRITICAL)


def xid_list(value: str) -> tuple[int, ...]:
    """Xid numbers separated by commas or spaces (empty: 48 only), sorted, 48 included."""
    codes = {ALWAYS_CRITICAL}
    for item in (i for i in re.split(r"[,\s]+", value.strip(), flags=re.ASCII) if i):
        try:
            code = integer(item)
        except Invalid:
            raise Invalid(value, f"{item!r} is not an Xid number") from None
        if not 1 <= code <= MAX_XID:
            raise Invalid(value, f"Xid {code} is out of range (1 to {MAX_XID})")
        if code in APPLICATION_XIDS:
            raise Invalid(value, f"Xid {code} is an application error (NVIDIA's device "
                                 f"plugin ignores {', '.join(map(str, sorted(APPLICATION_XIDS)))}"
                                 "), never a sign of a bad GPU")
        codes.add(code)
    return tuple(sorted(codes))
