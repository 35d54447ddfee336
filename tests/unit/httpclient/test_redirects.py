"""Redirect resolution (upstream ResolvesRelativeRedirectLocations, RejectsUnresolvableRedirectLocation)."""

import pytest

from egress.httpclient.redirects import RedirectError, is_downgrade, normalise_url, resolve_location

CURRENT = "http://receiver.test:8080/api/v1/events?batch=7"


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("https://other.test/in", "https://other.test/in"),  # absolute: as is
        ("//mirror.test/x?y=1", "http://mirror.test/x?y=1"),  # network-path: current scheme
        ("?batch=8", "http://receiver.test:8080/api/v1/events?batch=8"),  # query only: origin + path
        ("/root/./a/../b", "http://receiver.test:8080/root/b"),  # absolute path: normalised
        ("ingest", "http://receiver.test:8080/api/v1/ingest"),  # relative: against the directory
        ("../v2/events", "http://receiver.test:8080/api/v2/events"),  # ".." pops
        ("./same/", "http://receiver.test:8080/api/v1/same/"),  # "." dropped, trailing "/" kept
        ("../../../../top", "http://receiver.test:8080/top"),  # never above the root
        ("..", "http://receiver.test:8080/api/"),
        ("https://other.test/in#part", "https://other.test/in"),  # fragments never go on the wire
    ],
)
def test_resolves_the_six_location_forms(location: str, expected: str) -> None:
    assert resolve_location(CURRENT, location) == expected


@pytest.mark.parametrize("location", ["", "   ", "ftp://files.test/x", "http://", "https:///path", "mailto:a@b.c",
                                      "http://[::1"])
def test_rejects_unresolvable_locations(location: str) -> None:
    with pytest.raises(RedirectError):
        resolve_location(CURRENT, location)


def test_an_empty_query_leaves_no_question_mark() -> None:
    assert normalise_url("http://h.test/path?") == "http://h.test/path"
    assert normalise_url("http://h.test") == "http://h.test/"
    assert resolve_location("http://h.test/a", "/b?") == "http://h.test/b"


def test_only_https_to_http_is_a_downgrade() -> None:
    assert is_downgrade("https://a.test/", "http://a.test/")
    assert not is_downgrade("http://a.test/", "https://a.test/")
    assert not is_downgrade("https://a.test/", "https://b.test/")
