"""The process function of the firehose_delivery example: one flight row becomes one Firehose record.

Input: a row of the ``flights`` stream (the 19 typed columns of ``data/flights-2013.csv.gz``; missing
values are ``None``). Output: one message on ``records`` whose ``record`` column is the row as compact
JSON (orjson, keys in schema order, ``null`` for missing values), e.g.
``{"year":2013,"month":1,"day":1,"dep_time":517,...,"time_hour":"2013-01-01T10:00:00Z"}``, about 300
bytes. Every flight gives a record, cancelled ones (``dep_time`` null) included, so all 336,776 arrive.
The sink base64-encodes each record into ``records[].data`` of a Firehose request.
"""

from __future__ import annotations

from typing import Any

import orjson

from egress import MapFunction, RuntimeContext


def flight_record(row: dict[str, Any]) -> str:
    """The record of one flight row: its compact JSON text (UTF-8 when sent)."""
    return orjson.dumps(row).decode()


class FlightToRecord(MapFunction):
    """A map (``egress.MapFunction``): one record per flight, to the computation's only output stream."""

    def map(self, row: dict[str, Any], ctx: RuntimeContext) -> dict[str, Any]:
        return {"record": flight_record(row)}
