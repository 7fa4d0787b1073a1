"""A careless or hostile STARTUP_TAINT through the real CLI: refused when the settings load,
before anything is written or any API call is made: exit 2, one line naming the setting as
it was given and the cause, no traceback, the arena unchanged. Every command loads the
settings, so `install` (the first the DaemonSet runs) shows it as well as `agent` would.
"""

from __future__ import annotations

import pytest

from adversarial.harness import VERSION, Arena, assert_refused, assert_untouched

NOEXECUTE = "NoExecute is refused"
CASES = [
    ("noexecute-env", (), {"STARTUP_TAINT": "gpu-node-installer/driver-not-ready:NoExecute"},
     ("STARTUP_TAINT=", NOEXECUTE)),
    ("noexecute-flag", ("--startup-taint", "x=y:NoExecute"), {},
     ("--startup-taint=", NOEXECUTE)),
    ("no-effect", (), {"STARTUP_TAINT": "gpu-node-installer/driver-not-ready"},
     ("STARTUP_TAINT=", "no ':Effect'")),
    ("lowercase-effect", (), {"STARTUP_TAINT": "k:noschedule"},
     ("STARTUP_TAINT=", "is not NoSchedule or PreferNoSchedule")),
    ("empty-key", (), {"STARTUP_TAINT": ":NoSchedule"}, ("STARTUP_TAINT=", "not a taint key")),
    ("two-slashes", (), {"STARTUP_TAINT": "a/b/c:NoSchedule"},
     ("STARTUP_TAINT=", "not a taint key")),
    ("newline-smuggles-a-second-taint", (), {"STARTUP_TAINT": "k:NoSchedule\nx:NoExecute"},
     ("STARTUP_TAINT=", "U+000A")),
    ("bidi-override", (), {"STARTUP_TAINT": "k\u202e:NoSchedule"},
     ("STARTUP_TAINT=", "U+202E")),
    ("value-too-long", (), {"STARTUP_TAINT": "k=" + "v" * 64 + ":NoSchedule"},
     ("STARTUP_TAINT=", "not a taint value")),
    ("value-with-a-space", (), {"STARTUP_TAINT": "k=a b:NoSchedule"},
     ("STARTUP_TAINT=", "not a taint value")),
    ("restore-yes", (), {"STARTUP_TAINT_RESTORE": "yes"},
     ("STARTUP_TAINT_RESTORE=", "one of on, off")),
]


@pytest.mark.parametrize(("flags", "env", "causes"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_refused_before_any_write(arena: Arena, flags: tuple[str, ...], env: dict[str, str],
                                  causes: tuple[str, ...]) -> None:
    before = arena.snapshot()
    done = arena.run("install", *arena.args(), "--driver-version", VERSION,
                     "--mirror", f"file://{arena.scene.repo}", *flags,
                     env={"TERMINATION_LOG": str(arena.termination_log), **env})
    assert_refused(done, 2, *causes)
    assert "error(config)" in done.lines[0]
    assert_untouched(before, arena.snapshot())
