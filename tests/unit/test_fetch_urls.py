"""Mirror URL handling (stages/fetch/urls.py, local.py, failures.py, responses.py): shown
without secrets, joined without surprises, decoded without climbing out, failures ranked."""

from __future__ import annotations

import contextlib
import os.path
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from installer.errors import (
    DownloadError,
    InstallerError,
    IntegrityError,
    PackageNotFoundError,
    StagingError,
)
from installer.stages.fetch.failures import (
    DeadlineExpired,
    NotOnMirror,
    SourceFailure,
    TlsError,
    combined,
)
from installer.stages.fetch.local import contained_url, local_path, mirror_root
from installer.stages.fetch.responses import retry_after
from installer.stages.fetch.urls import UnsafePathError, check_relpath, join, safe, scrub

SECRETY = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E,
                                         exclude_characters="@:/?#[]%\\"), min_size=6, max_size=24)


class TestSafe:
    """What is shown never carries userinfo, query or fragment."""

    def test_drops_userinfo_and_query(self) -> None:
        url = "https://user:pa55word@mirror.example:8443/repo?token=SECRET#frag"
        assert safe(url) == "https://mirror.example:8443/repo"

    def test_unparseable_url_shows_no_secret(self) -> None:
        assert safe("https://u:PW@[::1/repo?token=SECRET#frag") == "https://[::1/repo"

    @given(user=SECRETY, password=SECRETY, token=SECRETY)
    def test_never_shows_a_secret(self, user: str, password: str, token: str) -> None:
        url = f"https://{user}:{password}@127.0.0.1:8443/repo?token={token}"
        shown = safe(url)
        assert password not in shown and token not in shown and user not in shown


class TestScrub:
    """Foreign text (requests' exception messages) loses every secret of the URL."""

    def test_requests_style_message(self) -> None:
        url = "https://bot:hunter2pass@127.0.0.1:9/repo?token=tok3nSECRET"
        text = ("HTTPSConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with "
                "url: /repo/index.json?token=tok3nSECRET (Caused by ...) "
                "https://bot:hunter2pass@127.0.0.1:9/repo")
        cleaned = scrub(text, url)
        assert "tok3nSECRET" not in cleaned and "hunter2pass" not in cleaned
        assert "/repo/index.json" in cleaned

    @given(password=SECRETY, token=SECRETY, noise=st.text(max_size=40))
    def test_hypothesis(self, password: str, token: str, noise: str) -> None:
        url = f"https://u:{password}@h/r?token={token}"
        text = f"{noise}{url}{noise}?token={token} {password}"
        cleaned = scrub(text, url)
        assert password not in cleaned and f"token={token}" not in cleaned


class TestJoin:
    """The base's query rides on every request; '?' and '#' in a path stay in the path."""

    def test_keeps_the_query(self) -> None:
        assert (join("https://h/repo?token=T", "index.json")
                == "https://h/repo/index.json?token=T")

    def test_quotes_query_and_fragment_marks(self) -> None:
        joined = urllib.parse.urlsplit(join("https://h/repo", "a?b#c"))
        assert joined.path == "/repo/a%3Fb%23c" and not joined.query and not joined.fragment

    @given(st.text(min_size=1, max_size=60))
    def test_never_changes_query_or_host(self, relpath: str) -> None:
        joined = urllib.parse.urlsplit(join("https://h:1/repo?t=1", relpath))
        assert (joined.netloc, joined.query, joined.fragment) == ("h:1", "t=1", "")


class TestCheckRelpath:
    """Percent-encoding cannot smuggle '..', '/', or NUL past the repository's checks."""

    @pytest.mark.parametrize("path", ["a/%2e%2e/b", "a/%2E%2E%2Fb", "%2e", "a/..%2fb",
                                      "a/b%00c", "a/%5c..", "a//b", "a/%ff"])
    def test_refused(self, path: str) -> None:
        with pytest.raises(UnsafePathError, match="is refused"):
            check_relpath(path, "mirror m")

    def test_plain_and_escaped_names_pass(self) -> None:
        assert check_relpath("lib64/lib%20x.so.1", "m") == "lib64/lib x.so.1"

    @given(st.text(max_size=80))
    def test_total_and_contained(self, path: str) -> None:
        try:
            decoded = check_relpath(path, "m")
        except UnsafePathError:
            return
        joined = os.path.normpath(os.path.join("/root", decoded))
        assert joined.startswith("/root/") and "\x00" not in decoded


class TestLocal:
    """file:// mirrors: the base is checked and every file stays under the resolved root."""

    def test_root_refuses_encoded_dot_dot(self) -> None:
        with pytest.raises(UnsafePathError):
            mirror_root("file:///srv/repo/%2e%2e/etc")

    def test_symlink_out_is_refused(self, tmp_path: Path) -> None:
        (tmp_path / "repo").mkdir()
        (tmp_path / "secret").write_text("x")
        (tmp_path / "repo" / "link").symlink_to(tmp_path / "secret")
        root = mirror_root(f"file://{tmp_path / 'repo'}")
        with pytest.raises(UnsafePathError, match="outside the mirror root"):
            contained_url(root, "link", "m")

    def test_round_trip_of_odd_names(self, tmp_path: Path) -> None:
        root = mirror_root(f"file://{tmp_path}")
        url = contained_url(root, "a%25b%20c", "m")
        assert local_path(url) == tmp_path / "a%b c"

    @given(st.text(max_size=60))
    def test_root_is_total(self, path: str) -> None:
        with contextlib.suppress(InstallerError):
            mirror_root("file:///" + path)


class TestCombined:
    """When every source fails: one line naming each, coded by the most telling cause."""

    def test_integrity_outranks_download_and_not_found(self) -> None:
        error = combined("no source delivered p", [
            SourceFailure("mirror a", NotOnMirror("mirror a index.json answered 404")),
            SourceFailure("mirror b", TlsError("TLS verification failed for mirror b")),
            SourceFailure("mirror c", IntegrityError("mirror c index.json is not valid JSON"))])
        assert error.code == 7
        assert "mirror a: index.json answered 404" in error.message
        assert "mirror b: TLS verification failed" in error.message
        assert "mirror c: index.json is not valid JSON" in error.message

    def test_download_outranks_not_found_and_keeps_its_remedy(self) -> None:
        error = combined("x", [SourceFailure("a", NotOnMirror("404")),
                               SourceFailure("b", TlsError("TLS verification failed"))])
        assert error.code == 6 and "--ca-bundle" in error.remedy

    def test_a_passed_deadline_ends_it(self) -> None:
        deadline = DeadlineExpired("deadline passed")
        assert combined("x", [SourceFailure("a", IntegrityError("bad")),
                              SourceFailure("b", deadline)]) is deadline

    def test_a_local_failure_is_reported_as_it_is(self) -> None:
        local = StagingError("disk full")
        assert combined("x", [SourceFailure("a", DownloadError("503")),
                              SourceFailure("b", local)]) is local

    def test_nothing_tried_is_not_found(self) -> None:
        assert isinstance(combined("x", []), PackageNotFoundError)


class TestRetryAfter:
    """Both forms of Retry-After, and nothing else, become seconds."""

    def test_forms(self) -> None:
        assert retry_after("120") == 120.0
        assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
        assert retry_after("soon") is None and retry_after("٣") is None

    @given(st.text(max_size=40))
    def test_total(self, value: str) -> None:
        seconds = retry_after(value)
        assert seconds is None or 0 <= seconds <= 1e9
