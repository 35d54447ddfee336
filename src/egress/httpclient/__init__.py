"""Outgoing HTTP: the only layer that knows the HTTP client library (libcurl via pycurl)."""

from egress.httpclient.backoff import BackoffPolicy, backoff_microseconds, backoff_seconds
from egress.httpclient.curl import CurlClient, Request, Response

__all__ = ["BackoffPolicy", "CurlClient", "Request", "Response", "backoff_microseconds", "backoff_seconds"]
