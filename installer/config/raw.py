"""A setting's raw text (flag, env var or default) and its parsing into values, with the one
line a refusal gives. The rows themselves are `installer.config.SETTINGS`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from installer.config import values
from installer.config.values import Invalid
from installer.errors import ConfigError

if TYPE_CHECKING:
    from installer.config import Setting

SPACES = " \t\n\r\x0b\x0c"  # what separates list items in an env var (ASCII only)
# may carry credentials or tokens: never shown
URL_SETTINGS = ("mirrors", "kube_api", "kube_api_proxy", "cos_tools_url", "nvidia_runfile_url",
                "ubuntu_apt_mirror")


def raw_value(setting: Setting, flags: Mapping[str, Any], environ: Mapping[str, str]
               ) -> tuple[str | None, str]:
    """The raw text for a setting and where it came from (flag wins over env, env over default)."""
    flag_value = flags.get(setting.name)
    if flag_value not in (None, False, ()):
        return (str(flag_value) if not isinstance(flag_value, bool) else "true"), setting.flag
    if setting.envvar and setting.envvar in environ:
        return environ[setting.envvar], setting.envvar
    return setting.default, f"default of {setting.flag}"


def parse_many(setting: Setting, flags: Mapping[str, Any], environ: Mapping[str, str]
                ) -> tuple[Any, ...]:
    """A repeatable setting: every flag value, else the env var split on commas/whitespace."""
    flag_values = flags.get(setting.name) or ()
    if isinstance(flag_values, str):
        flag_values = (flag_values,)
    if flag_values:
        items, source = [str(v) for v in flag_values], setting.flag
    elif setting.envvar and environ.get(setting.envvar, "").strip(SPACES):
        text = environ[setting.envvar].strip(SPACES)
        items, source = re.split(r"[,\s]+", text, flags=re.ASCII), setting.envvar
    else:
        return ()
    parsed = []
    for item in (i for i in items if i):
        try:
            parsed.append(setting.parse(item))
        except Invalid as exc:
            raise refusal(setting, source, item, exc) from None
    return tuple(parsed)


def refusal(setting: Setting, source: str, raw: str, exc: Invalid) -> ConfigError:
    """One line: the flag or env var as given, the value (repr: controls stay visible), why."""
    why = f": {exc.reason}" if exc.reason else ""
    shown = values.shown_url(raw) if setting.name in URL_SETTINGS else raw
    return ConfigError(f"{source}={shown!r} is invalid{why}",
                       remedy=f"{setting.flag.lstrip('-')} must be {setting.accepted}")
