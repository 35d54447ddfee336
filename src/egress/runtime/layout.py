"""What a state directory's committed data depends on: the layout of the Spec that wrote it.

Committed messages sit in log partitions chosen by ``partition_count`` and their stream's
``group_by`` key, stored in the stream's schema; a source's committed position counts records of
what it reads; positions, outbox, sink progress, state and timers are filed under computation,
partition and sink ids. A run whose Spec differs in any of these leaves committed messages where
no job reads them (a lower ``partition_count`` strands the higher partitions) or reads them under
another key, schema or file. So the state directory records this layout when a run first opens
it, and a run with a different layout is refused before it starts (:class:`SpecMismatchError`).

The layout, in the Spec's own paths:

- ``partition_count``;
- ``streams/<id>/schema`` (each column's type and ``required``; the column order is not part of
  it, rows are stored by column name) and ``streams/<id>/group_by``;
- ``sources/<id>/``: ``source_class_name`` (aliases of one class are equal), ``output_stream_id``
  and ``parameters/path`` (what a file source reads, as the Spec names it; ``parameters/stream``
  for a ``nats`` source) and ``parameters/readers`` when a source has more than one reader (each
  reader's position and state count in its share of the input);
- ``computations/<id>/``: ``computation_class_name``, ``input_stream_ids``,
  ``output_stream_ids``, and per sink ``sinks/<id>/sink_class_name`` and ``input_stream_ids``.

New streams, sources and computations may be added (they start from nothing); nothing recorded
may change or go. Everything else may change between runs: sink and source parameters other than
``path`` (URLs, headers, batching, retries), ``processing_function`` and its parameters (a new
version of the code), and the whole DynamicSpec.

Independently of the record, :func:`unreachable_work` counts committed work that no job of a
Spec would ever handle, so a run never reports "drained" while some is stranded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import orjson

from egress.connectors import SINKS, SOURCES
from egress.engines import CommittedInventory, StateLocation
from egress.engines.sqlite import check_metadata, read_metadata, state_directory
from egress.errors import SpecMismatchError
from egress.runtime.plan import Plan

LAYOUT_KEY = "spec_layout"
"""The state directory's metadata key holding the recorded layout (JSON)."""


def way_out(location: StateLocation, drained: bool = False) -> str:
    """What to do about committed data a Spec's layout does not fit, at ``location``; ``drained``:
    it holds no work waiting (:func:`holds_no_work`), so running the old Spec would deliver nothing."""
    if drained:
        return (f"everything committed there is already delivered, but this Spec cannot take over its state and "
                f"source positions: {location.start_over} (its sources are then read from the start), or keep "
                "running the Spec it was written with")
    return (f"run it with the Spec it was written with until drained, or {location.start_over} "
            "(egress does not move committed messages, state and timers to another layout)")


def holds_no_work(inventory: CommittedInventory) -> bool:
    """Whether ``inventory`` has nothing waiting: every log partition a computation read is read to its
    end, no outbox message waits for a sink, no timer is pending."""
    read_to_end = all(min(inventory.read_positions.get(lane, [end]), default=end) >= end
                      for lane, end in inventory.log_ends.items())
    return read_to_end and not any(inventory.outbox.values()) and not any(inventory.timers.values())


_MAY_GROW = frozenset({"streams", "sources", "computations"})
_ABSENT: Any = object()


class LayoutChange(NamedTuple):
    """One difference: the Spec ``path``, its recorded and current values (``None``: absent)."""

    path: str
    recorded: Any
    current: Any


def spec_layout(plan: Plan) -> dict[str, Any]:
    """The layout of ``plan``'s Spec (module docstring) as a JSON-able dict in the Spec's shape."""
    spec = plan.spec
    sources: dict[str, Any] = {}
    for source_id, source in spec.sources.items():
        entry: dict[str, Any] = {"source_class_name": SOURCES.canonical_name(source.source_class_name),
                                 "output_stream_id": source.output_stream_id}
        planned = plan.sources[source_id]
        parameters: dict[str, Any] = {planned.reads_parameter: planned.reads} if planned.reads else {}
        if planned.readers > 1:  # a reader's position and state count in its share of the input only
            parameters["readers"] = planned.readers
        if parameters:
            entry["parameters"] = parameters
        sources[source_id] = entry
    return {
        "partition_count": spec.partition_count,
        "streams": {
            stream_id: {"schema": {c.name: f"{c.type} required" if c.required else c.type for c in stream.columns},
                        "group_by": list(stream.group_by)}
            for stream_id, stream in spec.streams.items()
        },
        "sources": sources,
        "computations": {
            computation_id: {
                "computation_class_name": computation.computation_class_name,
                "input_stream_ids": list(computation.input_stream_ids),
                "output_stream_ids": list(computation.output_stream_ids),
                "sinks": {sink_id: {"sink_class_name": SINKS.canonical_name(sink.sink_class_name),
                                    "input_stream_ids": list(sink.input_stream_ids)}
                          for sink_id, sink in computation.sinks.items()},
            }
            for computation_id, computation in spec.computations.items()
        },
    }


def layout_changes(recorded: dict[str, Any], current: dict[str, Any], path: str = "") -> list[LayoutChange]:
    """Every difference from ``recorded`` to ``current``, in recorded order; entries added to
    ``streams``, ``sources`` and ``computations`` are not differences."""
    changes: list[LayoutChange] = []
    for key, old in recorded.items():
        at = f"{path}/{key}" if path else key
        new = current.get(key, _ABSENT)
        if isinstance(old, dict) and isinstance(new, dict):
            changes += layout_changes(old, new, at)
        elif new != old:
            changes.append(LayoutChange(at, old, None if new is _ABSENT else new))
    if path not in _MAY_GROW:
        changes += [LayoutChange(f"{path}/{key}" if path else key, None, new)
                    for key, new in current.items() if key not in recorded]
    return changes


def layout_mismatch(recorded: dict[str, Any], plan: Plan, location: StateLocation,
                    drained: bool = False) -> SpecMismatchError | None:
    """The error refusing ``plan`` on the committed data at ``location`` that recorded ``recorded``,
    or ``None`` when the layouts agree (up to additions). One line: the first change, how many
    more, the way out (:func:`way_out`, ``drained`` as there)."""
    changes = layout_changes(recorded, spec_layout(plan))
    if not changes:
        return None
    first = changes[0]
    more = ""
    if len(changes) > 1:
        rest = changes[1:]
        more = f" (and {len(rest)} more change{'s' if len(rest) > 1 else ''}: {', '.join(c.path for c in rest)})"
    message = f"{_describe(first, location.name)}{more}: {way_out(location, drained)}"
    return SpecMismatchError(message, path=first.path, file=plan.spec_file, state_dir=location.name)


def _describe(change: LayoutChange, directory: str) -> str:
    if change.recorded is None:
        now = "it" if isinstance(change.current, dict) else _render(change.current)
        return f"{directory} was written without {change.path}; the Spec now has {now}"
    written = change.path if isinstance(change.recorded, dict) else f"{change.path} {_render(change.recorded)}"
    if change.current is None:
        return f"{directory} was written with {written}; the Spec now has none"
    return f"{directory} was written with {written}; the Spec now says {_render(change.current)}"


def _render(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def unreachable_work(inventory: CommittedInventory, plan: Plan) -> list[str]:
    """Committed work in ``inventory`` that no job of ``plan`` would ever handle, one line per
    place (empty when there is none):

    - log messages of a ``(stream, partition)`` no job reads (a partition at or above
      ``partition_count``, or a stream no computation reads any more), counted from the lowest
      position a former reader committed (all of them when none did; none for a stream that no
      computation reads or ever read: those were never on their way anywhere);
    - outbox messages of a computation or partition the Spec does not have, or of a stream no
      sink of that computation reads;
    - timers of a computation or partition the Spec does not have.
    """
    partition_count = plan.spec.partition_count
    computations = plan.computations
    read = {lane for computation in computations.values() for lane in computation.input_lanes}
    lines: list[str] = []
    for (stream, partition), end in sorted(inventory.log_ends.items()):
        if stream in read and partition < partition_count:
            continue
        positions = inventory.read_positions.get((stream, partition), [])
        if not positions and stream not in read:
            continue
        waiting = end - min(positions, default=0)
        if waiting > 0:
            shown = plan.stream_of(stream)
            reason = f"partition_count is {partition_count}" if partition >= partition_count \
                else f"no computation reads {shown} now"
            lines.append(f"stream {shown} partition {partition}: {waiting:,} committed messages no job of this Spec "
                         f"reads ({reason})")
    for (computation_id, partition, stream), count in sorted(inventory.outbox.items()):
        why = _missing_job(computation_id, partition, plan)
        if why is None and stream not in {sink.stream_id for sink in computations[computation_id].sinks.values()}:
            why = f"no sink of {computation_id} reads {stream}"
        if why is not None:
            lines.append(f"computation {computation_id} partition {partition}: {count:,} committed messages of "
                         f"stream {stream} no sink of this Spec delivers ({why})")
    for (computation_id, partition), count in sorted(inventory.timers.items()):
        why = _missing_job(computation_id, partition, plan)
        if why is not None:
            lines.append(f"computation {computation_id} partition {partition}: {count:,} timers that will never "
                         f"fire ({why})")
    return lines


def _missing_job(computation_id: str, partition: int, plan: Plan) -> str | None:
    """Why ``plan`` has no job for ``(computation_id, partition)``, or ``None`` when it has one."""
    if computation_id not in plan.computations:
        return f"the Spec has no computation {computation_id}"
    if partition >= plan.spec.partition_count:
        return f"partition_count is {plan.spec.partition_count}"
    return None


def unrecorded_mismatch(unreachable: list[str], plan: Plan, location: StateLocation) -> SpecMismatchError:
    """The error refusing ``plan`` on committed data at ``location`` that recorded no layout
    (written by an egress from before the record) but holds committed work ``plan`` cannot reach
    (``unreachable``)."""
    more = f" (and {len(unreachable) - 1} more)" if len(unreachable) > 1 else ""
    message = (f"{location.name} records no Spec layout (an earlier egress wrote it) and holds committed "
               f"work this Spec cannot reach: {unreachable[0]}{more}: {way_out(location)}")
    return SpecMismatchError(message, file=plan.spec_file, state_dir=location.name)


def check_recorded_layout(plan: Plan, state_dir: str | Path) -> str:
    """What ``egress validate --state-dir`` reports, read without taking the directory over: a
    one-line note when ``plan`` may run on ``state_dir``; raises :class:`SpecMismatchError` when
    its layout differs from the recorded one or the directory belongs to another pipeline,
    :class:`StateDirectoryError` when its layout version is not one this egress reads."""
    meta = read_metadata(state_dir)
    if meta is None:
        return f"state directory {state_dir} holds no committed state yet"
    try:
        check_metadata(meta, state_dir, plan.spec.pipeline)
    except SpecMismatchError as other_pipeline:
        raise other_pipeline.in_file(plan.spec_file) from None
    text = meta.get(LAYOUT_KEY)
    if text is None:
        return (f"state directory {state_dir} records no Spec layout yet (an earlier egress wrote it); the next run "
                "checks that this Spec reaches all its committed work, then records it")
    mismatch = layout_mismatch(orjson.loads(text), plan, state_directory(state_dir))
    if mismatch is not None:
        raise mismatch
    return f"state directory {state_dir} was written with this Spec's layout"
