"""Mirror URLs: shown without secrets, joined without surprises, decoded without climbing out.

A mirror URL may carry credentials (`https://user:pass@host/repo`) and a token in its query
(`?token=...`); neither may ever reach a log, a message or a file the installer writes:
`safe()` is the form shown, `scrub()` cleans foreign text (requests' exception messages
embed the URL). `join()` keeps the query on every request and quotes what would change a
URL's meaning (`?`, `#`); `check_relpath()` refuses a relative path whose percent-decoded
form would leave the repository (`%2e%2e%2f`, `%2f`, encoded NUL).
"""

from __future__ import annotations

import urllib.parse

from installer.config.values import shown_url
from installer.errors import IntegrityError

# Characters kept as they are in a joined path; '%' too, so existing escapes keep meaning.
_PATH_SAFE = "/%!$&'()*+,;=:@-._~"


class UnsafePathError(IntegrityError):
    """A path of a mirror (or of its index or manifest) would leave the mirror's root."""

    default_remedy = ("republish the package with plain relative paths; a mirror must not "
                      "name files outside its own tree")


def redact(url: str) -> str:
    """A URL without user and password (the query kept): what requests may still use."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None and "@" not in parts.netloc:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def safe(url: str) -> str:
    """A URL without credentials, query or fragment: the only form logged or shown (the
    settings' own refusals show URLs the same way)."""
    return shown_url(url)


def secrets_of(url: str) -> list[str]:
    """The substrings of `url` that must never be shown (longest first)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return [url]
    found: set[str] = set()
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    for value in (userinfo, parts.password, parts.query, parts.fragment):
        if value:
            found.update({value, urllib.parse.unquote(value)})
    if parts.username and len(parts.username) >= 3:
        found.update({parts.username, urllib.parse.unquote(parts.username)})
    return sorted(found, key=len, reverse=True)


def scrub(text: str, *urls: str) -> str:
    """`text` with every secret of `urls` removed (their query strings and userinfo)."""
    for url in urls:
        for secret in secrets_of(url):
            text = text.replace(f"?{secret}", "").replace(f"{secret}@", "")
            text = text.replace(secret, "***")
    return text


def check_relpath(relpath: str, where: str) -> str:
    """`relpath` as a mirror would read it (percent-decoded), refused if it could climb out."""
    decoded = []
    for raw in relpath.split("/"):
        try:
            part: str | None = urllib.parse.unquote(raw, errors="strict")
        except UnicodeDecodeError:
            part = None
        problem = _segment_problem(part)
        if problem:
            raise UnsafePathError(f"{where}: path {relpath[:200]!r} is refused: segment "
                                  f"{raw[:60]!r} {problem}")
        decoded.append(str(part))
    return "/".join(decoded)


def _segment_problem(part: str | None) -> str | None:
    if part is None:
        return "is not valid UTF-8 once decoded"
    if part in ("", ".", ".."):
        return "is empty, '.' or '..' once decoded"
    if "/" in part or "\\" in part:
        return "holds an encoded '/' or '\\'"
    if any(ord(c) < 32 or c == "\x7f" for c in part):
        return "holds a control character (NUL included) once decoded"
    return None


def join(base: str, relpath: str) -> str:
    """`base` + '/' + `relpath`, the base's query kept (a token is sent on every request)."""
    parts = urllib.parse.urlsplit(base)
    quoted = urllib.parse.quote(relpath, safe=_PATH_SAFE)
    return urllib.parse.urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{quoted}"))
