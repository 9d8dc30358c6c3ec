"""The Azure trace reader: parsing, time scaling, and errors that name file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsd.errors import ConfigError
from fsd.workload.trace import parse_timestamp, read_trace

SHIPPED = Path(__file__).resolve().parents[2] / "scenarios" / "traces" / "azure-llm-2023-conv.csv"
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD = (
    HEADER
    + "2023-11-16 18:15:46.5000000,374,44\n"
    + "2023-11-16 18:15:47.0000000,396,109\n"
    + "2023-11-16 18:15:49.0,879,55\n"
    + "2023-11-16 18:15:50,91,16\n"
)


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_reads_arrivals_from_zero_and_token_counts(tmp_path):
    w = read_trace(write(tmp_path, GOOD))
    assert [r.arrival for r in w] == pytest.approx([0.0, 0.5, 2.5, 3.5])
    assert [r.prompt_len for r in w] == [374, 396, 879, 91]
    assert [r.output_len for r in w] == [44, 109, 55, 16]
    assert w.source == "t.csv" and w.params["time_scale"] == 1.0


@pytest.mark.parametrize(("scale", "gap"), [(0.5, 1.0), (1.0, 0.5), (2.0, 0.25)])
def test_time_scale_multiplies_the_rate(tmp_path, scale, gap):
    """0.5 = half the rate: every gap is stretched by 1 / 0.5."""
    w = read_trace(write(tmp_path, GOOD), time_scale=scale)
    assert w[1].arrival == pytest.approx(gap)
    assert w[3].arrival == pytest.approx(3.5 / scale)
    assert w.rate == pytest.approx(scale * 3 / 3.5)


def test_numeric_timestamps_unsorted_rows_and_limit(tmp_path):
    text = HEADER + "10.5,5,2\n3.0,7,1\n\n4,9,3\n"
    w = read_trace(write(tmp_path, text))
    assert [(r.arrival, r.prompt_len) for r in w] == [(0.0, 7), (1.0, 9), (7.5, 5)]
    assert len(read_trace(write(tmp_path, text), limit=2)) == 2


def test_zero_generated_tokens_become_one_and_are_counted(tmp_path):
    w = read_trace(write(tmp_path, HEADER + "1,5,0\n2,5,3\n"))
    assert [r.output_len for r in w] == [1, 3]
    assert w.params["zero_outputs"] == 1


def test_extra_columns_in_any_order(tmp_path):
    text = "GeneratedTokens,Other,TIMESTAMP,ContextTokens\n4,x,1.0,8\n"
    assert read_trace(write(tmp_path, text))[0] == (0.0, 8, 4)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "2023-11-16 18:15:46.5,abc,44\n",
            r"t\.csv:2: field ContextTokens: 'abc' is not a whole number",
        ),
        (
            "2023-11-16 18:15:46.5,10,4\n2023-11-16 18:15:47,10,-3\n",
            r"t\.csv:3: field GeneratedTokens: -3 must be >= 0",
        ),
        ("2023-11-16 18:15:46.5,0,4\n", r"t\.csv:2: field ContextTokens: 0 must be >= 1"),
        ("yesterday,10,4\n", r"t\.csv:2: field TIMESTAMP: 'yesterday' is not a timestamp"),
        ("2023-13-16 18:15:46,10,4\n", r"t\.csv:2: field TIMESTAMP"),
        ("nan,10,4\n", r"t\.csv:2: field TIMESTAMP: 'nan'"),
        ("1.0,10,4\n2.0,10\n", r"t\.csv:3: expected 3 fields, got 2"),
        ("", r"t\.csv: the trace has a header but no requests"),
    ],
)
def test_malformed_lines_name_file_line_and_field(tmp_path, body, message):
    with pytest.raises(ConfigError, match=message):
        read_trace(write(tmp_path, HEADER + body))


def test_header_problems(tmp_path):
    with pytest.raises(ConfigError, match=r"t\.csv:1: header lacks column\(s\) GeneratedTokens"):
        read_trace(write(tmp_path, "TIMESTAMP,ContextTokens\n1,2\n"))
    with pytest.raises(ConfigError, match="the trace is empty"):
        read_trace(write(tmp_path, ""))
    with pytest.raises(ConfigError, match="does not exist"):
        read_trace(tmp_path / "missing.csv")


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf")])
def test_bad_time_scale(tmp_path, scale):
    with pytest.raises(ConfigError, match="time_scale must be > 0"):
        read_trace(write(tmp_path, GOOD), time_scale=scale)


def test_parse_timestamp_keeps_seven_fractional_digits():
    a = parse_timestamp("2023-11-16 18:15:46.6805900")
    b = parse_timestamp("2023-11-16 18:15:46")
    assert a - b == pytest.approx(0.68059)
    assert parse_timestamp(" 12.5 ") == 12.5


def test_shipped_conversation_trace_slice():
    w = read_trace(SHIPPED, limit=500)
    s = w.summary()
    assert s["requests"] == 500
    assert 2.0 < s["rate"] < 12.0
    assert w[0] == (0.0, 374, 44)
