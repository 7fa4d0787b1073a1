"""UPGRADE_WAIT_FOR_JOBS and its timeout as a careless or hostile operator gives them,
through the real CLI: refused before anything is written (exit 2, one line naming the
setting as given and the term at fault), the arena unchanged."""

from __future__ import annotations

import pytest

from adversarial.harness import VERSION, Arena, Result, refused_untouched


def _install(arena: Arena, env: dict[str, str]) -> Result:
    return arena.run("install", *arena.args(), "--driver-version", VERSION,
                     "--mirror", f"file://{arena.scene.repo}",
                     env={"TERMINATION_LOG": str(arena.termination_log), **env})


# (id, env, the texts the one line must hold)
BAD = [
    ("selector-space-in-key", {"UPGRADE_WAIT_FOR_JOBS": "app name=batch"},
     ("UPGRADE_WAIT_FOR_JOBS=", "'app name' is not a label key")),
    ("selector-set-unclosed", {"UPGRADE_WAIT_FOR_JOBS": "app in (a,b"},
     ("UPGRADE_WAIT_FOR_JOBS=", "its parentheses do not pair")),
    ("selector-set-nested", {"UPGRADE_WAIT_FOR_JOBS": "app in ((a))"},
     ("UPGRADE_WAIT_FOR_JOBS=", "its parentheses do not pair")),
    ("selector-set-without-list", {"UPGRADE_WAIT_FOR_JOBS": "app in a"},
     ("UPGRADE_WAIT_FOR_JOBS=", "'app in a' is not a label key")),
    ("selector-set-value-with-space", {"UPGRADE_WAIT_FOR_JOBS": "app notin (a b)"},
     ("UPGRADE_WAIT_FOR_JOBS=", "'app notin (a b)' is not a selector term")),
    ("selector-set-bad-key", {"UPGRADE_WAIT_FOR_JOBS": "-app in (a)"},
     ("UPGRADE_WAIT_FOR_JOBS=", "'-app' is not a label key")),
    ("selector-greater-than-text", {"UPGRADE_WAIT_FOR_JOBS": "gpus>two"},
     ("UPGRADE_WAIT_FOR_JOBS=", "'gpus>two' is not a selector term")),
    ("selector-greater-than-beyond-int64", {"UPGRADE_WAIT_FOR_JOBS": "gpus>9223372036854775808"},
     ("UPGRADE_WAIT_FOR_JOBS=", "is not a selector term")),
    ("selector-negated-equality", {"UPGRADE_WAIT_FOR_JOBS": "!app=batch"},
     ("UPGRADE_WAIT_FOR_JOBS=", "'!app=batch' is not a selector term")),
    ("selector-value-with-space", {"UPGRADE_WAIT_FOR_JOBS": "app=nightly batch"},
     ("UPGRADE_WAIT_FOR_JOBS=", "'app=nightly batch' is not a selector term")),
    ("selector-newline", {"UPGRADE_WAIT_FOR_JOBS": "app=batch\nrm"},
     ("UPGRADE_WAIT_FOR_JOBS=",)),
    ("selector-empty-key", {"UPGRADE_WAIT_FOR_JOBS": "=batch"},
     ("UPGRADE_WAIT_FOR_JOBS=", "'=batch' is not a selector term")),
    ("timeout-negative", {"UPGRADE_WAIT_FOR_JOBS_TIMEOUT": "-1"},
     ("UPGRADE_WAIT_FOR_JOBS_TIMEOUT='-1'",)),
    ("timeout-beyond-a-week", {"UPGRADE_WAIT_FOR_JOBS_TIMEOUT": "604801"},
     ("UPGRADE_WAIT_FOR_JOBS_TIMEOUT='604801'", "0 to 604800")),
    ("timeout-nan", {"UPGRADE_WAIT_FOR_JOBS_TIMEOUT": "nan"},
     ("UPGRADE_WAIT_FOR_JOBS_TIMEOUT='nan'",)),
]


@pytest.mark.parametrize(("env", "causes"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_wait_for_jobs_setting_is_refused(arena: Arena, env: dict[str, str],
                                                causes: tuple[str, ...]) -> None:
    refused_untouched(arena, lambda: _install(arena, env), 2, *causes, allowed=())
