"""Reading ``egress receiver``'s record file (one JSON object per line) while the receiver may
still be writing it: only complete lines count, so a poll that lands mid-write sees the request on
its next look instead of failing on half a line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def recorded(record: Path) -> list[dict[str, Any]]:
    """Every complete line of ``record`` parsed, in file order; ``[]`` when it does not exist yet.

    A last line without its newline is being written and is left for the next read."""
    try:
        text = record.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    complete, _, _partial = text.rpartition("\n")
    return [json.loads(line) for line in complete.splitlines() if line]


def recorded_count(record: Path) -> int:
    """How many requests ``record`` holds complete lines for."""
    try:
        return record.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0
