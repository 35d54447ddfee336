"""The proxy environment read once, by libcurl's rules (``egress.httpclient.proxy``)."""

from __future__ import annotations

import pytest

from egress.httpclient.proxy import ProxyOptions, proxy_options


def test_an_empty_environment_gives_no_proxy_and_no_exempted_host() -> None:
    assert proxy_options({}) == ProxyOptions("", {"http": "", "https": ""})


def test_http_uses_only_the_lower_case_http_proxy_then_all_proxy() -> None:
    # HTTP_PROXY can come from a CGI request's Proxy: header: libcurl never reads it, nor do we.
    assert proxy_options({"HTTP_PROXY": "http://evil:1"}).proxies["http"] == ""
    assert proxy_options({"http_proxy": "http://p:1", "all_proxy": "http://a:2"}).proxies["http"] == "http://p:1"
    assert proxy_options({"all_proxy": "http://a:2", "ALL_PROXY": "http://A:3"}).proxies["http"] == "http://a:2"
    assert proxy_options({"ALL_PROXY": "http://A:3"}).proxies["http"] == "http://A:3"


@pytest.mark.parametrize(("environ", "expected"), [
    ({"https_proxy": "http://s:1", "HTTPS_PROXY": "http://S:2", "all_proxy": "http://a:3"}, "http://s:1"),
    ({"HTTPS_PROXY": "http://S:2", "all_proxy": "http://a:3"}, "http://S:2"),
    ({"http_proxy": "http://p:1", "ALL_PROXY": "http://A:4"}, "http://A:4"),  # http_proxy is not for https
])
def test_https_uses_https_proxy_in_either_case_then_all_proxy(environ: dict[str, str], expected: str) -> None:
    assert proxy_options(environ).proxies["https"] == expected


def test_no_proxy_lower_case_first_and_empty_variables_count_as_unset() -> None:
    assert proxy_options({"no_proxy": "a.example", "NO_PROXY": "b.example"}).no_proxy == "a.example"
    assert proxy_options({"no_proxy": "", "NO_PROXY": "b.example"}).no_proxy == "b.example"
    assert proxy_options({"http_proxy": "", "all_proxy": "http://a:2"}).proxies["http"] == "http://a:2"
