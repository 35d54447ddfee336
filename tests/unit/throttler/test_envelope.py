"""The envelope at the point of use: units that ``throttle()`` hands to callers, over every window,
across many callers, clients and classes, with ``max_grant_amount`` set or not, a limit change and a
controller restart, on the virtual clock (hypothesis)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from egress.clock import VirtualClock
from egress.throttler.controller import ThrottlerController
from egress.throttler.envelope import RateSteps, worst_excess
from egress.throttler.factory import ThrottlerFactory
from egress.throttler.models import ThrottlerSpec
from egress.throttler.transport import InProcessTransport

SETTINGS = settings(max_examples=int(os.environ.get("EGRESS_HYPOTHESIS_EXAMPLES", "60")), deadline=None)
SLACK = 1e-6


@dataclass
class Scenario:
    burst: int  # limit·period, units
    period: float
    request_period: float
    max_grant_amount: int | None
    classes: dict[str, float]
    clients: list[tuple[str | None, list[list[tuple[float, int]]]]]  # (class, callers: [(gap s, amount)])
    new_burst: int
    change_at: float
    restart_at: float | None = None  # the controller stops then, and a new one starts `outage` s later
    outage: float = 0.0
    state_file: bool = False  # the new controller reads the old one's restart horizon (else: assumes a restart)

    @property
    def limit(self) -> float:
        return self.burst / self.period

    @property
    def new_limit(self) -> float:
        return self.new_burst / self.period

    def spec(self, burst: int) -> ThrottlerSpec:
        return ThrottlerSpec.model_validate({
            "limit": burst / self.period, "period": f"{round(self.period * 1000)}ms",
            "request_period": f"{round(self.request_period * 1000)}ms", "max_grant_amount": self.max_grant_amount,
            "classes": {c: {"weight": w} for c, w in self.classes.items()}})


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    period = draw(st.integers(100, 3000)) / 1000
    burst, new_burst = draw(st.integers(1, 30)), draw(st.integers(1, 30))
    largest = min(burst, new_burst)  # every call fits the burst before and after the change
    classes = draw(st.dictionaries(st.sampled_from(["a", "b"]), st.floats(0.2, 5), max_size=2))
    call = st.tuples(st.integers(0, 2000).map(lambda ms: ms / 1000), st.integers(1, largest))
    caller = st.lists(call, min_size=1, max_size=5)
    client = st.tuples(st.sampled_from([None, "a", "b", "zz"]), st.lists(caller, min_size=1, max_size=6))
    restart_at = draw(st.none() | st.integers(0, 8000).map(lambda ms: ms / 1000))
    outage = draw(st.integers(0, 2000)) / 1000
    change_at = draw(st.integers(0, 8000)) / 1000
    if restart_at is not None and draw(st.booleans()):  # the limit changes while clients retry their RPCs
        change_at = restart_at + draw(st.integers(0, round(outage * 1000))) / 1000
    return Scenario(burst=burst, period=period, request_period=draw(st.integers(50, 3000)) / 1000,
                    max_grant_amount=draw(st.none() | st.integers(1, 10)), classes=classes,
                    clients=draw(st.lists(client, min_size=1, max_size=5)), new_burst=new_burst,
                    change_at=change_at, restart_at=restart_at, outage=outage, state_file=draw(st.booleans()))


async def released_to_callers(scenario: Scenario) -> list[tuple[float, float]]:
    """Run every caller through its client on one controller; returns (time, units) of each return of
    ``throttle()``: the point of use."""
    clock = VirtualClock()
    specs = {"q": scenario.spec(scenario.burst)}
    with tempfile.TemporaryDirectory() as directory:
        state_file = Path(directory) / "throttler.json" if scenario.state_file else None
        return await _run(scenario, clock, specs, state_file)


async def _run(scenario: Scenario, clock: VirtualClock, specs: dict[str, ThrottlerSpec],
               state_file: Path | None) -> list[tuple[float, float]]:
    transport = InProcessTransport(ThrottlerController(specs, clock, state_file=state_file))
    factories = [ThrottlerFactory(transport, clock, specs, class_ids={"q": class_id}, client_id=f"client{i}")
                 for i, (class_id, _) in enumerate(scenario.clients)]
    releases: list[tuple[float, float]] = []

    async def caller(factory: ThrottlerFactory, calls: list[tuple[float, int]]) -> None:
        handle = factory.get_throttler_or_throw("q")
        for gap, amount in calls:
            await clock.sleep(gap)
            await handle.throttle(amount)
            releases.append((clock.monotonic(), float(amount)))

    async def change_limit() -> None:
        await clock.sleep_until(scenario.change_at)
        specs["q"] = scenario.spec(scenario.new_burst)
        transport.controller.reconfigure(specs)
        for factory in factories:
            factory.reconfigure(specs)

    async def restart() -> None:
        if scenario.restart_at is None:
            return
        await clock.sleep_until(scenario.restart_at)
        await transport.controller.aclose()  # clients find it unreachable and retry
        await clock.sleep(scenario.outage)
        transport.controller = ThrottlerController(specs, clock, state_file=state_file,
                                                   assume_restart=state_file is None)

    async with clock.autojumping():
        events = [asyncio.create_task(change_limit()), asyncio.create_task(restart())]
        await asyncio.gather(*(caller(factory, calls) for factory, (_, callers) in zip(factories, scenario.clients,
                                                                                       strict=True)
                               for calls in callers))
        for event in events:
            event.cancel()
    for factory in factories:
        await factory.aclose()
    await transport.controller.aclose()
    return releases


@SETTINGS
@given(scenario=scenarios())
# The burst shrinks while a client retries an RPC folded under the larger one (the controller restarts
# without a state file): the retry must ask for what fits the new burst, not 14 units beyond 13.
@example(Scenario(burst=26, period=1.003, request_period=0.05, max_grant_amount=None, classes={},
                  clients=[(None, [[(0.0, 1)], [(0.0, 1)], [(0.0, 11), (0.0, 6)], [(0.0, 13), (0.0, 8)]])],
                  new_burst=13, change_at=0.001, restart_at=0.001, outage=0.0, state_file=False))
@example(Scenario(burst=5, period=1.006, request_period=0.05, max_grant_amount=None, classes={},
                  clients=[(None, [[(0.0, 1)], [(0.0, 1)] * 5, [(0.001, 1)], [(0.001, 1)]])],
                  new_burst=1, change_at=0.202, restart_at=0.202, outage=0.0, state_file=False))
def test_units_released_to_callers_keep_the_envelope_over_every_window(scenario: Scenario) -> None:
    releases = asyncio.run(released_to_callers(scenario))
    assert sum(units for _, units in releases) == sum(a for _, cs in scenario.clients for c in cs for _, a in c)
    limit = RateSteps([(0.0, scenario.limit), (scenario.change_at, scenario.new_limit)])
    burst = max(scenario.burst, scenario.new_burst)
    assert worst_excess(releases, limit, burst) <= SLACK * burst
