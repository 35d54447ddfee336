"""The webhook endpoint breaker (pure, on given times), the committed per-endpoint state and the
parameters' files."""

from __future__ import annotations

import base64
import math
import random
from pathlib import Path

import pytest
import yaml

from egress.connectors.sinks.webhook_breaker import Breaker
from egress.connectors.sinks.webhook_endpoints import Delivery, Endpoint, Prefixes, decode_state, encode_state
from egress.connectors.sinks.webhook_parameters import BreakerSpec, WebhookSinkDynamicParameters, WebhookSinkParameters
from egress.errors import SpecError
from egress.runtime import load_plan
from tests.conftest import REPO

SECRET = "whsec_" + base64.b64encode(b"unit-test-secret-0123456789abcdef").decode()
SPEC = BreakerSpec.model_validate({"window": "10s", "minimum_requests": 4, "failure_ratio": 0.5, "open_for": "5s",
                                    "half_open_probes": 1, "disable_after": "30s"})


def test_it_opens_only_with_the_minimum_count_and_the_failure_ratio_in_the_window() -> None:
    breaker = Breaker(SPEC)
    for t in (0.0, 1.0, 2.0):
        breaker.record(t, failed=True)
    assert breaker.state(2.5) == "closed"  # 3 failures < minimum_requests
    breaker.record(20.0, failed=False)  # the window has moved: the old failures no longer count
    for t in (20.1, 20.2):
        breaker.record(t, failed=True)
    assert breaker.state(20.3) == "closed"  # 2 of 3 in the window, still fewer than 4
    breaker.record(20.4, failed=True)
    assert breaker.state(20.5) == "open"
    assert not breaker.admit(21.0)
    assert breaker.wait_until(21.0) == pytest.approx(25.4)


def test_half_open_lets_one_probe_go_a_success_closes_and_a_failure_opens_again() -> None:
    breaker = Breaker(SPEC)
    for t in (0.0, 0.1, 0.2, 0.3):
        breaker.record(t, failed=True)
    assert breaker.state(5.3) == "half_open"
    assert breaker.admit(5.3)
    assert not breaker.admit(5.3)  # one probe at a time
    assert breaker.wait_until(5.3) == math.inf
    breaker.record(5.4, failed=True)
    assert breaker.state(5.5) == "open"
    assert breaker.admit(10.4)
    breaker.record(10.5, failed=False)
    assert breaker.state(10.6) == "closed"
    assert breaker.opened == 2


def test_not_closed_for_disable_after_it_is_paused_until_resumed() -> None:
    breaker = Breaker(SPEC)
    for t in (0.0, 0.1, 0.2, 0.3):
        breaker.record(t, failed=True)
    now = 0.3
    while now < 30.0:  # each probe fails
        now += 5.0
        if breaker.admit(now):
            breaker.record(now, failed=True)
    assert breaker.state(now) == "paused"
    assert not breaker.admit(now + 100)
    assert breaker.wait_until(now + 100) == math.inf
    breaker.resume()
    assert breaker.admit(now + 100)


def test_the_committed_state_round_trips_and_is_empty_without_endpoints_ahead() -> None:
    assert encode_state({}) == b""
    assert decode_state(b"") == {}
    assert decode_state(encode_state({"acme": 17, "https://x.example/a": 3})) == {"acme": 17, "https://x.example/a": 3}


def test_parameters_need_one_endpoint_column_and_secrets_by_reference(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="exactly one of endpoint_column and url_column"):
        WebhookSinkParameters.model_validate({"payload_column": "p"})
    with pytest.raises(ValueError, match=r"secret file .* cannot be read"):
        WebhookSinkDynamicParameters.model_validate(
            {"endpoints": {"a": {"url": "http://127.0.0.1:9/", "secret_file": str(tmp_path / "missing")}}})
    with pytest.raises(ValueError, match="must not set webhook-id"):
        WebhookSinkDynamicParameters.model_validate(
            {"endpoints": {"a": {"url": "http://127.0.0.1:9/", "headers": {"Webhook-Id": "x"}}}})


def test_a_relative_secret_file_starts_at_the_specs_folder_and_an_unreadable_one_names_its_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As every other file a sink names: the Spec's folder, whatever folder egress runs in."""
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "hooks.secret").write_text(SECRET + "\n")
    document = yaml.safe_load((REPO / "examples" / "webhooks" / "spec.yaml").read_text())
    document["sources"]["flights_csv"]["parameters"]["path"] = str(
        REPO / "examples" / "http_delivery" / "data" / "flights-2013-01.csv.gz")
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(document))
    dynamic = yaml.safe_load((REPO / "examples" / "webhooks" / "dynamic_spec.yaml").read_text())
    sink = dynamic["computations"]["to_events"]["sinks"]["airlines"]["parameters"]
    sink["endpoints"] = {"UA": {"url": "http://127.0.0.1:9/hooks/UA", "secret_file": "hooks.secret"}}
    sink["defaults"] = {"secret_file": "hooks.secret"}
    dynamic_spec = tmp_path / "dynamic_spec.yaml"
    dynamic_spec.write_text(yaml.safe_dump(dynamic))
    monkeypatch.chdir(tmp_path)  # where egress runs: not the Spec's folder
    monkeypatch.syspath_prepend(str(REPO))
    parameters = load_plan(spec, dynamic_spec).computations["to_events"].sinks["airlines"].dynamic_parameters
    assert parameters.endpoints["UA"].secret_file == str(folder / "hooks.secret")
    assert parameters.defaults.secret_file == str(folder / "hooks.secret")
    sink["endpoints"]["UA"]["secret_file"] = "missing.secret"
    dynamic_spec.write_text(yaml.safe_dump(dynamic))
    with pytest.raises(SpecError) as raised:
        load_plan(spec, dynamic_spec)
    assert str(dynamic_spec) in str(raised.value)
    assert "computations/to_events/sinks/airlines/parameters/endpoints/UA/secret_file" in str(raised.value)
    assert str(folder / "missing.secret") in str(raised.value)


def test_the_prefixes_kept_as_acknowledgements_come_match_a_visit_of_every_endpoint() -> None:
    """The partition-wide prefix and the per-endpoint ones, from a heap updated with what changed,
    against the minimum over all endpoints, through random queues and acknowledgements."""
    rng = random.Random(27)
    endpoints = [Endpoint(f"e{i}", None, BreakerSpec(), 0) for i in range(8)]
    prefixes = Prefixes({"e3": 5, "gone": 2}, 0)  # committed before a restart: e3 acknowledged up to 5
    endpoints[3].acked = 5
    seq, last = 5, 0
    for _ in range(300):
        changed: set[Endpoint] = set()
        for _ in range(rng.randrange(4)):  # new messages
            seq += 1
            endpoint = rng.choice(endpoints)
            endpoint.pending.append(Delivery(endpoint, seq, b"m", b"k", b"body"))
            changed.add(endpoint)
        for endpoint in rng.sample(endpoints, 3):  # acknowledgements, in any order within an endpoint
            waiting = [d for d in endpoint.pending if not d.done]
            if waiting:
                rng.choice(waiting).done = True
                changed.add(endpoint)
        last = seq
        low = prefixes.advance(changed, last)
        firsts = [e.first_unacknowledged() for e in endpoints]
        assert low == min([last, *(f - 1 for f in firsts if f is not None)])
        assert prefixes.ahead == {e.name: e.acked for e in endpoints if e.acked > low}
