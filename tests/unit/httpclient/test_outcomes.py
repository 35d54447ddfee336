"""Why an HTTP attempt failed, as a type (``egress.httpclient.outcomes``), and how the async HTTP
sink uses it: its verdict, its transport-error metric by class and its dead-letter attempts. The
sink runs here on ``MockTransport``, the offline transport of ``egress.httpclient``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from egress.httpclient import Request, Response
from egress.httpclient.curl import CLIENT_CLOSED, Completions
from egress.httpclient.outcomes import CURL_ERROR_KINDS, AttemptFailure, FailureKind, curl_error_kind, failure_of
from egress.httpclient.transport import MockTransport, submit_many
from tests.unit.connectors.sinks.test_async_http_delivery import Harness, Outcome


@pytest.mark.parametrize(("code", "kind"), [
    (6, FailureKind.RESOLVE), (7, FailureKind.CONNECT), (28, FailureKind.TIMEOUT), (18, FailureKind.RESET),
    (52, FailureKind.RESET), (55, FailureKind.RESET), (56, FailureKind.RESET), (35, FailureKind.TLS),
    (60, FailureKind.TLS), (77, FailureKind.TLS), (1, FailureKind.PROTOCOL), (8, FailureKind.PROTOCOL),
    (47, FailureKind.REDIRECT), (23, FailureKind.OTHER), (9999, FailureKind.OTHER)])
def test_libcurl_error_codes_map_to_their_class(code: int, kind: FailureKind) -> None:
    assert curl_error_kind(code) is kind
    failure = failure_of(Response(0, f"curl error {code}: text", curl_code=code))
    assert failure == AttemptFailure(kind, f"curl error {code}: text", 0, code)


def test_every_mapped_code_has_a_class_other_than_status_and_other() -> None:
    assert all(kind not in (FailureKind.STATUS, FailureKind.OTHER) for kind in CURL_ERROR_KINDS.values())


def test_a_complete_2xx_is_no_failure() -> None:
    assert failure_of(Response(200)) is None
    assert failure_of(Response(204)) is None


@pytest.mark.parametrize("status", [301, 404, 429, 500, 503])
def test_a_complete_non_2xx_response_fails_with_its_status(status: int) -> None:
    failure = failure_of(Response(status))
    assert failure == AttemptFailure(FailureKind.STATUS, f"HTTP status {status}", status, 0)
    assert str(failure) == f"HTTP status {status}"


def test_a_transport_error_after_the_status_arrived_is_the_transport_error() -> None:
    failure = failure_of(Response(200, "curl error 18: transfer closed", curl_code=18))
    assert failure is not None
    assert (failure.kind, failure.status, failure.curl_code) == (FailureKind.RESET, 200, 18)


def test_a_request_pending_when_its_client_closed_is_closed_and_an_uncoded_error_is_other() -> None:
    assert failure_of(Response(0, CLIENT_CLOSED)) == AttemptFailure(FailureKind.CLOSED, CLIENT_CLOSED)
    assert failure_of(Response(0, "some error")) == AttemptFailure(FailureKind.OTHER, "some error")


async def test_mock_transport_answers_one_submit_many_as_one_batch_and_skips_cancelled_tokens() -> None:
    transport = MockTransport(lambda request: Response(200 if request.body == b"a" else 503))
    batches: list[list[tuple[str, Response]]] = []
    completions = Completions(asyncio.get_running_loop(), batches.append, lambda token: token == "dropped")
    url = "http://x.test/"
    futures = submit_many(transport, [(Request(url, b"a"), "one"), (Request(url, b"b"), "two"),
                                      (Request(url, b"c"), "dropped")], completions)
    assert futures == []  # batched: no future per request
    await asyncio.sleep(0)
    assert [[(token, response.status) for token, response in batch] for batch in batches] == [[("one", 200),
                                                                                                ("two", 503)]]
    assert [request.body for request in transport.requests] == [b"a", b"b"]
    assert (await transport.submit(Request("http://x.test/", b"a"))).ok
    transport.close()
    with pytest.raises(RuntimeError):
        transport.submit_many([], completions)


def harness_on(transport: MockTransport, **kwargs: object) -> Harness:
    h = Harness(lambda request, n: Outcome(200), **kwargs)  # type: ignore[arg-type]
    h.transport = transport  # type: ignore[assignment]  # the sink creates its transport at the first request
    return h


async def test_the_sink_counts_transport_errors_by_class_and_not_statuses() -> None:
    answers = iter([Response(0, "curl error 28: Operation timed out", curl_code=28),
                    Response(0, "curl error 7: Couldn't connect", curl_code=7), Response(503), Response(200)])
    h = harness_on(MockTransport(lambda request: next(answers)))
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.sink.progress().max_persisted_seq_no == 1
    errors = {kind: h.metrics.value("egress_sink_transport_errors_total", sink_id="http",
                                    error_class=kind) for kind in ("timeout", "connect")}
    assert errors == {"timeout": 1, "connect": 1}
    assert h.counter("attempt_failures") == 2
    assert h.counter("responses", status_code="503") == 1


async def test_dead_letter_attempts_record_the_status_or_the_transport_error(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    answers = iter([Response(503), Response(0, "curl error 56: Connection reset by peer", curl_code=56),
                    Response(200, "curl error 18: transfer closed", curl_code=18)])
    h = harness_on(MockTransport(lambda request: next(answers)), static={"dead_letter_path": str(path)},
                   dynamic={"max_attempt_count": 3})
    h.distribute(["a"])
    await h.clock.advance(100)
    assert h.sink.progress().max_persisted_seq_no == 1
    [line] = [json.loads(text) for text in path.read_text().splitlines()]
    assert [(attempt["status"], attempt["error"]) for attempt in line["attempts"]] == [
        (503, None), (None, "curl error 56: Connection reset by peer"), (None, "curl error 18: transfer closed")]
    assert line["error"].endswith("last error: curl error 18: transfer closed")
