"""What a running pipeline gives its dashboard (:mod:`egress.observe.dashboard`): the Spec's graph,
the end offsets of the streams computations read, and the throttlers' limits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from egress.errors import SpecError
from egress.observe.dashboard import Dashboard, graph_document
from egress.spec.models import Spec
from egress.throttler.models import validate_dynamic_throttlers

if TYPE_CHECKING:
    from egress.runtime.pipeline import Pipeline


def spec_graph(spec: Spec) -> dict[str, Any]:
    """Sources → computations → sinks of ``spec`` (see :func:`~egress.observe.dashboard.graph_document`)."""
    return graph_document(
        sources={source_id: source.source_class_name for source_id, source in spec.sources.items()},
        computations={cid: (c.input_stream_ids, c.output_stream_ids) for cid, c in spec.computations.items()},
        source_streams={source_id: source.output_stream_id for source_id, source in spec.sources.items()},
        sinks={cid: {sink_id: sink.sink_class_name for sink_id, sink in c.sinks.items()}
               for cid, c in spec.computations.items()},
    )


async def stream_ends(pipeline: Pipeline) -> dict[tuple[str, int], int]:
    """The end offset of each ``(stream, partition)`` a computation reads (``{}`` while no engine is open)."""
    engine = pipeline.engine
    if engine is None:
        return {}
    streams = sorted({stream for computation in pipeline.plan.computations.values()
                      for stream in computation.input_stream_ids})
    return {(stream, partition): await engine.end_offset(stream, partition)
            for stream in streams for partition in range(pipeline.plan.spec.partition_count)}


def throttler_limits(pipeline: Pipeline) -> dict[str, float | None]:
    """Units per second each throttler of the DynamicSpec in force allows (``ThrottlerSpec.rate``;
    ``None``: unlimited)."""
    try:
        specs = validate_dynamic_throttlers(pipeline.plan.dynamic_spec)
    except SpecError:
        return {}
    return {throttler_id: spec.rate for throttler_id, spec in specs.items()}


def pipeline_dashboard(pipeline: Pipeline) -> Dashboard:
    """The dashboard of ``pipeline``: its ``/status`` document, metrics, graph, stream ends and limits."""

    async def ends() -> dict[tuple[str, int], int]:
        return await stream_ends(pipeline)

    return Dashboard(pipeline.metrics.registry, pipeline.clock, title=f"pipeline {pipeline.plan.spec.pipeline}",
                     status=pipeline.status_document, graph=lambda: spec_graph(pipeline.plan.spec),
                     ends=ends, limits=lambda: throttler_limits(pipeline))
