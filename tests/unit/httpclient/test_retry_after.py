"""Retry-After (RFC 9110 §10.2.3) as a pure function of the value and the wall time."""

from __future__ import annotations

import pytest

from egress.httpclient.retry_after import MAX_DELAY_SECONDS, endpoint_of, retry_after_seconds

NOW = 784_111_770.0  # Sun, 06 Nov 1994 08:49:30 GMT: RFC 9110's example date is 7 s later


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("120", 120.0), (" 7 ", 7.0), ("0007", 7.0)])
def test_delay_seconds_are_whole_seconds_from_now(value: str, seconds: float) -> None:
    assert retry_after_seconds(value, NOW) == seconds


def test_a_huge_delay_is_cut_before_it_overflows() -> None:
    assert retry_after_seconds("9" * 400, NOW) == MAX_DELAY_SECONDS


@pytest.mark.parametrize("value", [
    "Sun, 06 Nov 1994 08:49:37 GMT",   # IMF-fixdate
    "Sunday, 06-Nov-94 08:49:37 GMT",  # obsolete RFC 850 form
    "Sun Nov  6 08:49:37 1994",        # ANSI C asctime() form, no zone: UTC
])
def test_the_three_http_date_forms_count_from_the_wall_time(value: str) -> None:
    assert retry_after_seconds(value, NOW) == 7.0


def test_a_date_in_the_past_means_no_wait() -> None:
    assert retry_after_seconds("Sun, 06 Nov 1994 08:49:00 GMT", NOW) == 0.0


@pytest.mark.parametrize("value", ["", "soon", "-5", "1.5", "120 s", "+3", "١٢", "Sun, 31 Feb 1994 08:49:37 GMT",
                                   "Sun, 06 Nov 1994 25:49:37 GMT"])
def test_values_in_neither_form_are_none(value: str) -> None:
    assert retry_after_seconds(value, NOW) is None


def test_an_endpoint_is_scheme_host_and_port_with_the_default_port_filled_in() -> None:
    assert endpoint_of("http://Receiver.test/a?x=1") == endpoint_of("HTTP://receiver.test:80/b") == (
        "http", "receiver.test", 80)
    assert endpoint_of("https://receiver.test/a") == ("https", "receiver.test", 443)
    assert endpoint_of("http://receiver.test:8080/a") != endpoint_of("http://receiver.test/a")
    assert endpoint_of("http://receiver.test:99999/a") == ("http", "receiver.test", -1)
