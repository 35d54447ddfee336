import pytest

from egress.spec import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("100ms", 0.1), ("10s", 10.0), ("1m", 60.0), ("1h", 3600.0), ("1d", 86400.0), ("1m30s", 90.0),
     ("1.5s", 1.5), ("250us", 0.00025), (1500, 1.5), ("2000", 2.0), (0, 0.0)],
)
def test_parses_flow_durations_to_seconds(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["10 parsecs", "", "s", "-1s", "1.5", True, 1.5, None, -5, "10sec"])
def test_rejects_unparseable_durations_with_a_hint(bad: object) -> None:
    with pytest.raises(ValueError, match=r"duration"):
        parse_duration(bad)


def test_formats_durations_back_exactly() -> None:
    assert format_duration(0.1) == "100ms"
    assert format_duration(60.0) == "60s"
