"""DynamicSpec ``throttlers``: the pydantic models of a named distributed throttler and their rules.

Source: upstream ``TDynamicThrottlerSpec`` / ``TDynamicThrottlerClassSpec``
(``yt/yt/flow/library/cpp/common/spec.h``) and seed 001. ``DynamicSpec.throttlers`` stays a plain
``dict`` in :mod:`egress.spec`; :func:`validate_throttlers` turns it into :class:`ThrottlerSpec` values
and :func:`check_computation_throttlers` checks the ``computations/<c>/input_*_throttler_*`` fields
against them. Durations are ``float`` seconds (written ``100ms``, ``10s`` or integer milliseconds).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from egress.errors import SpecError, SpecErrors
from egress.spec.durations import Duration
from egress.spec.models import DynamicSpec, validate_model

DEFAULT_CLASS = "default"
"""The reserved quota class: weight 1.0, serves missing, empty and unknown class ids."""

CLASS_ID_PATTERN = re.compile(r"[0-9A-Za-z_-]+")
UNLIMITED_PREFETCH = 1_000_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ThrottlerClassSpec(_Strict):
    """One weighted quota class (upstream ``TDynamicThrottlerClassSpec``); ``weight`` > 0."""

    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)


class RetryingChannelSpec(_Strict):
    """Retries of ``RequestQuota`` (upstream ``TRetryingChannelConfig``, Flow's defaults).

    ``retry_attempts`` attempts at most, all within ``retry_timeout`` seconds; waits between attempts
    start at ``retry_backoff_time`` seconds and double (when ``enable_exponential_retry_backoffs``)
    up to ``max_backoff_time``.
    """

    enable_exponential_retry_backoffs: bool = True
    retry_attempts: int = Field(default=100, ge=1)
    retry_timeout: Duration = 600.0
    retry_backoff_time: Duration = 1.0
    max_backoff_time: Duration = 60.0


class ThrottlerSpec(_Strict):
    """A named distributed throttler (upstream ``TDynamicThrottlerSpec``).

    ``limit`` units/s (``None`` = unlimited); ``period`` seconds of averaging (bucket capacity and
    burst = ``limit * period``); ``request_period`` seconds between a client's RPCs; ``rpc_timeout``
    seconds per ``RequestQuota``; ``classes`` weighted quota classes; ``max_grant_amount`` units per
    server chunk; ``use_class_weights_as_limit`` makes the rate the sum of declared weights.
    ``safe_rate`` is beyond upstream (Doorman's safe capacity): units/s a client may use on its own
    while the controller is unreachable; ``None`` (default) or ``0`` waits, ``-1`` is unthrottled.
    ``fallback_rate`` (beyond upstream, opt-in) is units/s the whole pipeline may use while no
    controller can be reached: each process's clients of the throttler share ``fallback_rate /
    live workers`` (at most the rate; not with ``safe_rate``).
    """

    limit: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    period: Duration = 10.0
    request_period: Duration = 5.0
    retrying_channel: RetryingChannelSpec = RetryingChannelSpec()
    rpc_timeout: Duration = 30.0
    classes: dict[str, ThrottlerClassSpec] = {}
    max_grant_amount: int | None = Field(default=None, ge=1)
    use_class_weights_as_limit: bool = False
    safe_rate: float | None = Field(default=None, ge=-1, allow_inf_nan=False)
    fallback_rate: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @field_validator("period", "request_period", "rpc_timeout")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be a positive duration")
        return value

    @field_validator("classes")
    @classmethod
    def _class_ids(cls, value: dict[str, ThrottlerClassSpec]) -> dict[str, ThrottlerClassSpec]:
        for class_id in value:
            if not CLASS_ID_PATTERN.fullmatch(class_id):
                raise ValueError(f'Quota class id "{class_id}" must match [0-9A-Za-z_-]+')
            if class_id == DEFAULT_CLASS:
                raise ValueError(f'Quota class id "{DEFAULT_CLASS}" is reserved (weight 1.0)')
        return value

    @model_validator(mode="after")
    def _weights_as_limit(self) -> ThrottlerSpec:
        if self.use_class_weights_as_limit:
            if not self.classes:
                raise ValueError("use_class_weights_as_limit requires at least one class in \"classes\"")
            if self.limit is not None:
                raise ValueError("use_class_weights_as_limit cannot be combined with \"limit\"")
        if self.safe_rate is not None and -1 < self.safe_rate < 0:
            raise ValueError("safe_rate must be -1 (open), 0 (closed) or a positive rate")
        if self.fallback_rate is not None:
            if self.safe_rate is not None:
                raise ValueError("fallback_rate and safe_rate cannot both be set: fallback_rate is the pipeline's "
                                 "rate while no controller answers, shared by the workers; keep one")
            rate = self.rate
            if rate is not None and self.fallback_rate > rate:
                raise ValueError(f"fallback_rate {self.fallback_rate:g} exceeds the throttler's rate {rate:g}: the "
                                 "workers on their own would let more through than the controller; lower it")
        return self

    @property
    def rate(self) -> float | None:
        """Units/s the bucket refills with: ``limit``, or the sum of declared weights; ``None`` = unlimited."""
        if self.use_class_weights_as_limit:
            return sum(c.weight for c in self.classes.values())
        return self.limit

    @property
    def burst(self) -> float:
        """The bucket's capacity and largest burst, ``rate * period`` units (``inf`` when unlimited)."""
        rate = self.rate
        return math.inf if rate is None else rate * self.period

    @property
    def prefetch_lease(self) -> float:
        """Seconds a client may keep prefetched quota before using it: ``min(request_period, period / 2)``.

        The controller counts leased quota against the bucket until the lease ends, so a longer lease
        than ``period`` would stall the rate; half a period leaves half the burst to new demand.
        """
        return min(self.request_period, self.period / 2)

    @property
    def max_prefetch(self) -> float:
        """The client's MaxPrefetch: ``max(ceil(rate * request_period), 1)``; 1e9 when unlimited.

        Upstream reads ``limit / period_s * request_period_s`` where ``limit`` is already the amount
        per period; in units/s that is ``rate * request_period``.
        """
        rate = self.rate
        if rate is None:
            return float(UNLIMITED_PREFETCH)
        return float(max(math.ceil(rate * self.request_period - 1e-9), 1))

    def class_share(self, class_id: str | None) -> float:
        """The share ``w / Σw`` of the rate that ``class_id`` gets while every class waits, ``default``
        (weight 1.0) included; a missing, empty or unknown id is served as ``default``."""
        declared = self.classes.get(class_id) if class_id else None
        weight = declared.weight if declared is not None else 1.0
        return weight / (1.0 + sum(c.weight for c in self.classes.values()))

    def request_quantum(self, class_id: str | None) -> float:
        """Units one RPC of a client in ``class_id`` asks for the calls waiting in it, at most (a
        single call beyond it is asked whole): with ``classes``, the class's share of
        ``request_period`` at the rate, ``max(ceil(rate * share * request_period), 1)``, never beyond
        the burst; without, the burst (one queue: nothing to interleave with); ``inf`` when unlimited.

        So a class's waiting calls are granted in pieces of about one request period of its share
        whatever the number of callers, and classes interleave at that granularity at the point of use.
        """
        rate = self.rate
        if rate is None or not self.classes:
            return self.burst
        return min(self.burst, float(max(math.ceil(rate * self.class_share(class_id) * self.request_period - 1e-9), 1)))


def validate_throttlers(data: Mapping[str, Any], *, file: str | None = None) -> dict[str, ThrottlerSpec]:
    """Validate a DynamicSpec ``throttlers`` map; raises :class:`SpecErrors` naming ``throttlers/<id>/...``."""
    errors: list[SpecError] = []
    result: dict[str, ThrottlerSpec] = {}
    for throttler_id, raw in data.items():
        if not throttler_id:
            errors.append(SpecError("throttler id must not be empty", path="throttlers", file=file))
            continue
        try:
            result[throttler_id] = validate_model(ThrottlerSpec, raw if raw is not None else {}, file=file,
                                                  prefix=f"throttlers/{throttler_id}")
        except SpecErrors as found:
            errors.extend(found.errors)
    if errors:
        raise SpecErrors(errors)
    return result


def check_computation_throttlers(
    dynamic: DynamicSpec, throttlers: Mapping[str, ThrottlerSpec], *, file: str | None = None,
    computation_ids: list[str] | None = None,
) -> list[SpecError]:
    """Problems in ``computations/<c>/input_{rows,bytes}_throttler_{id,class_id}`` (empty list = valid).

    Checks: each id is declared in ``throttlers``; rows and bytes name different throttlers; a class
    id is only given with its throttler and is ``default`` or one of that throttler's classes; with
    ``computation_ids``, each configured computation exists. Call before the pipeline starts.
    """
    errors: list[SpecError] = []
    for name, computation in dynamic.computations.items():
        prefix = f"computations/{name}"
        if computation_ids is not None and name not in computation_ids:
            errors.append(SpecError(f'Unknown computation "{name}": not in the Spec', path=prefix, file=file))
            continue
        kinds = (("rows", computation.input_rows_throttler_id, computation.input_rows_throttler_class_id),
                 ("bytes", computation.input_bytes_throttler_id, computation.input_bytes_throttler_class_id))
        for kind, throttler_id, class_id in kinds:
            if throttler_id is None:
                if class_id is not None:
                    errors.append(SpecError(f"input_{kind}_throttler_class_id needs input_{kind}_throttler_id",
                                            path=f"{prefix}/input_{kind}_throttler_class_id", file=file))
                continue
            spec = throttlers.get(throttler_id)
            if spec is None and throttler_id in dynamic.throttlers:
                continue  # declared but invalid: reported by validate_throttlers
            if spec is None:
                errors.append(SpecError(f'Unknown throttler "{throttler_id}": declare it in dynamic_spec/throttlers',
                                        path=f"{prefix}/input_{kind}_throttler_id", file=file))
                continue
            if class_id is not None and class_id != DEFAULT_CLASS and class_id not in spec.classes:
                known = ", ".join(sorted([DEFAULT_CLASS, *spec.classes]))
                errors.append(SpecError(f'Unknown quota class "{class_id}" of throttler "{throttler_id}" '
                                        f"(known: {known})",
                                        path=f"{prefix}/input_{kind}_throttler_class_id", file=file))
        rows, bytes_ = computation.input_rows_throttler_id, computation.input_bytes_throttler_id
        if rows is not None and rows == bytes_:
            errors.append(SpecError(
                "input_rows_throttler_id and input_bytes_throttler_id must name different throttlers, "
                f'both are "{rows}" (one bucket cannot count both messages and bytes)',
                path=f"{prefix}/input_bytes_throttler_id", file=file))
    return errors


def validate_dynamic_throttlers(dynamic: DynamicSpec, *, file: str | None = None) -> dict[str, ThrottlerSpec]:
    """Validate ``dynamic.throttlers`` and every computation's throttler fields together.

    Returns the throttler specs by id; raises :class:`SpecErrors` listing every problem.
    """
    errors: list[SpecError] = []
    specs: dict[str, ThrottlerSpec] = {}
    try:
        specs = validate_throttlers(dynamic.throttlers, file=file)
    except SpecErrors as found:
        errors.extend(found.errors)
    errors.extend(check_computation_throttlers(dynamic, specs, file=file))
    if errors:
        raise SpecErrors(errors)
    return specs
