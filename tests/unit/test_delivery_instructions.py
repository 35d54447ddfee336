"""``benchmarks/delivery.py --instructions``: the instructions read from a cachegrind file, and the
per-message slope between two run lengths that takes the start-up out."""

from __future__ import annotations

from pathlib import Path

from benchmarks.delivery import cachegrind_total, instruction_lines


def test_the_total_is_read_from_the_summary_line(tmp_path: Path) -> None:
    out = tmp_path / "cachegrind.out"
    out.write_text("desc: --cache-sim=no\ncmd: python -m egress run\nevents: Ir\nfl=a.c\nfn=f\n3 40\n"
                   "summary: 4489123456\n")
    assert cachegrind_total(out) == 4_489_123_456


def test_the_slope_is_per_message_between_the_shortest_and_longest_run_and_leaves_the_start_up() -> None:
    # 1,300 M of start-up and 157,000 instructions per message, the longer run listed first.
    lines = instruction_lines([60_000, 20_000], [1_300_000_000 + 157_000 * 60_000, 1_300_000_000 + 157_000 * 20_000])
    assert lines[-1] == "  per message (slope 20,000 → 60,000): 157.0 K instructions; start-up 1,300 M"
    assert lines[0] == "  egress run of 60,000 messages: 10,720 M instructions"


def test_one_run_length_gives_no_slope() -> None:
    assert instruction_lines([20_000], [4_000_000_000]) == ["  egress run of 20,000 messages: 4,000 M instructions"]
