"""What ``egress run`` shows: a live progress line while it runs and a summary at the end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from egress.observe import Metrics
from egress.runtime import Pipeline, RunResult

if TYPE_CHECKING:
    from rich.table import Table

# The sinks' counters the summary adds up (every sink class's series of each family).
_SINK_COUNTERS = {
    "posts": "egress_sink_requests_total",
    "retries": "egress_sink_retries_total",
    "attempt_failures": "egress_sink_attempt_failures_total",
    "delivered": "egress_sink_records_delivered_total",
    "dead_letters": "egress_sink_dead_letters_total",
    "error_output_records": "egress_sink_error_output_records_total",
}
_ERROR_OUTPUT = _SINK_COUNTERS["error_output_records"]
_RESPONSES = "egress_sink_responses_total"


def snapshot(pipeline: Pipeline) -> dict[str, Any]:
    """Counters of a running or finished pipeline, as plain numbers (all sinks added up)."""
    metrics: Metrics = pipeline.metrics
    responses: dict[str, int] = {}
    for labels, value in metrics.samples(_RESPONSES):
        responses[labels["status_code"]] = responses.get(labels["status_code"], 0) + int(value)
    unacknowledged = sum(s.unacknowledged for job in pipeline.jobs for s in job.sinks.values())
    values: dict[str, Any] = {
        "rows_read": int(metrics.total("egress_source_rows_total")),
        "messages_processed": int(metrics.total("egress_computation_input_messages_total")),
        **bad_records(metrics),
    }
    for name, counter in _SINK_COUNTERS.items():
        values[name] = int(metrics.total(counter))
    values.update(
        responses=dict(sorted(responses.items())),
        responses_2xx=sum(v for k, v in responses.items() if k.startswith("2")),
        unacknowledged=unacknowledged,
        epochs=int(metrics.total("egress_epochs_committed_total")),
    )
    return values


def bad_records(metrics: Metrics) -> dict[str, int]:
    """Records the sources dropped under ``on_bad_record``: ``bad_records_skipped`` and
    ``bad_records_dead_lettered`` (all sources added up)."""
    counts = {"skip": 0, "dead_letter": 0}
    for labels, value in metrics.samples("egress_source_bad_records_total"):
        counts[labels["action"]] += int(value)
    return {"bad_records_skipped": counts["skip"], "bad_records_dead_lettered": counts["dead_letter"]}


def progress_line(values: dict[str, Any], elapsed: float) -> str:
    rate = values["delivered"] / elapsed if elapsed > 0 else 0.0
    return (
        f"read {values['rows_read']:,}  processed {values['messages_processed']:,}  "
        f"delivered {values['delivered']:,}  unacknowledged {values['unacknowledged']:,}  "
        f"POSTs {values['posts']:,}  retries {values['retries']:,}  {rate:,.0f} msg/s  {elapsed:,.1f} s"
    )


def final_report(pipeline: Pipeline, result: RunResult) -> dict[str, Any]:
    values = snapshot(pipeline)
    values.update(
        elapsed_seconds=round(result.elapsed, 3),
        messages_per_second=round(values["delivered"] / result.elapsed, 1) if result.elapsed > 0 else 0.0,
        drained=result.drained,
        blocked=result.blocked,
        error=str(result.error) if result.error else None,
        status={entry.path: entry.error for entry in pipeline.status.entries()},
        error_outputs=error_outputs(pipeline),
    )
    return values


def error_outputs(pipeline: Pipeline) -> dict[str, dict[str, Any]]:
    """The error outputs (``firehose_http``'s ``error_output``) written in this run, by
    ``computation/sink``: ``{"path": the file (absolute when the Spec's folder is), "records": N}``.
    Records there were not delivered, as dead letters; a sink writing none is left out."""
    found: dict[str, dict[str, Any]] = {}
    for labels, value in pipeline.metrics.samples(_ERROR_OUTPUT):
        computation = pipeline.plan.computations.get(labels["computation_id"])
        sink = computation.sinks.get(labels["sink_id"]) if computation is not None else None
        path = getattr(sink.parameters, "error_output", None) if sink is not None else None
        if value and path is not None:
            key = f"{labels['computation_id']}/{labels['sink_id']}"
            found[key] = {"path": path, "records": found.get(key, {}).get("records", 0) + int(value)}
    return dict(sorted(found.items()))


def summary_table(report: dict[str, Any], title: str = "egress run") -> Table:
    from rich.table import Table  # only when the table is shown: a --quiet run does not import rich

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    labels = {"attempt_failures": "transport errors"}  # failures before a complete response, not statuses
    labels.update(bad_records_skipped="bad records skipped", bad_records_dead_lettered="bad records dead-lettered")
    for name in ("rows_read", "bad_records_skipped", "bad_records_dead_lettered", "messages_processed", "posts",
                 "responses_2xx", "retries", "attempt_failures",
                 "delivered", "dead_letters", "error_output_records", "unacknowledged", "epochs"):
        table.add_row(labels.get(name, name.replace("_", " ")), f"{report[name]:,}")
    table.add_row("responses by status", ", ".join(f"{k}: {v:,}" for k, v in report["responses"].items()) or "-")
    table.add_row("elapsed", f"{report['elapsed_seconds']:.2f} s")
    table.add_row("messages/s", f"{report['messages_per_second']:,.0f}")
    return table
