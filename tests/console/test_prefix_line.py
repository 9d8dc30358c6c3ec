"""The console shows the prefix cache: a line in the KV panel (the Textual app and
`fsctl top --once`), the cached prompt tokens in a job's detail, the hit rate in
`fsctl watch`; `fsctl retune prefix_cache=...` takes on/off words only.

A recording from a daemon that predates the prefix cache renders as before."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from rich.console import Console

from fsd import protocol as P
from fsd.console import cli_format as fmt
from fsd.console.top import render
from fsd.console.top.app import TopApp
from fsd.console.top.data import fold
from fsd.errors import ConfigError
from tests.wire_samples import PREFIX


def with_prefix(recording: list, prefix: P.PrefixInfo | None) -> list:
    """The recording with `prefix` in every snapshot (as a daemon with the cache sends)."""
    return [
        msgspec.structs.replace(m, prefix=prefix) if isinstance(m, P.Snapshot) else m
        for m in recording
    ]


def kv_text(messages: list) -> str:
    return render.kv_panel(fold(messages).view()).plain  # type: ignore[union-attr]


def test_the_kv_panel_shows_hit_rates_cached_blocks_and_evictions(recording):
    lines = kv_text(with_prefix(recording, PREFIX)).splitlines()
    assert lines[-2] == "prefix    hit 60% (dev 40% host 20%)"
    assert lines[-1] == "          cached 12/3  evicted 5/1"


def test_a_cache_turned_off_is_one_word_and_an_older_daemon_shows_no_line(recording):
    off = msgspec.structs.replace(PREFIX, enabled=False)
    assert kv_text(with_prefix(recording, off)).splitlines()[-1] == "prefix    off"
    assert "prefix" not in kv_text(recording)  # the recording predates the cache
    no_queries = msgspec.structs.replace(PREFIX, queries=0, hits=0, host_hits=0)
    assert "hit 0% (dev 0% host 0%)" in kv_text(with_prefix(recording, no_queries))


def test_the_textual_console_and_top_once_render_the_line(recording):
    messages = with_prefix(recording, PREFIX)

    async def run() -> str:
        app = TopApp(None, None, state=fold(messages))
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            return str(app.query_one("#kv").render())

    assert "prefix    hit 60% (dev 40% host 20%)" in asyncio.run(run())
    console = Console(width=200, record=True, color_system=None)
    view = fold(messages).view()
    console.print(render.once(view, list(view.rows), "replay", 5, "enst"))
    assert "hit 60% (dev 40% host 20%)" in console.export_text()


def test_the_job_detail_counts_cached_prompt_tokens(recording):
    snap = next(m for m in reversed(recording) if isinstance(m, P.Snapshot) and m.jobs)
    job = snap.jobs[0]  # type: ignore[index]
    tokens = fmt.detail_line("tokens", f"{job.prompt_tokens} prompt, {job.output_tokens} output")
    assert tokens in fmt.job_lines(job)  # none cached: the line as before
    cached = msgspec.structs.replace(job, cached_tokens=32)
    line = f"{job.prompt_tokens} prompt (32 from the prefix cache), {job.output_tokens} output"
    assert fmt.detail_line("tokens", line) in fmt.job_lines(cached)


def test_fsctl_watch_prints_the_hit_rate(recording):
    snap = next(m for m in recording if isinstance(m, P.Snapshot))
    assert "prefix" not in fmt.snapshot_line(snap)
    assert fmt.snapshot_line(msgspec.structs.replace(snap, prefix=PREFIX)).endswith(
        " prefix-hit=60%"
    )
    off = msgspec.structs.replace(PREFIX, enabled=False)
    assert fmt.snapshot_line(msgspec.structs.replace(snap, prefix=off)).endswith("prefix-hit=off")


@pytest.mark.parametrize(
    ("text", "value"),
    [("false", False), ("true", True), ("OFF", False), ("on", True), (" no ", False)],
)
def test_retune_reads_prefix_cache_as_a_bool(text, value):
    assert fmt.parse_assignments([f"prefix_cache={text}"]) == {"prefix_cache": value}
    # and a policy's own on/off settings, by their POLICY.FIELD names
    assert fmt.parse_assignments([f"fsd.charge_prefill={text}"]) == {"fsd.charge_prefill": value}
    assert fmt.parse_assignments([f"sj-mlfq.swap_gate={text}"]) == {"sj-mlfq.swap_gate": value}


@pytest.mark.parametrize("text", ["1", "0", "maybe", "", "true,false", "none"])
def test_retune_refuses_anything_else_for_prefix_cache(text):
    with pytest.raises(ConfigError) as err:
        fmt.parse_assignments([f"prefix_cache={text}"])
    assert str(err.value) == (
        f"prefix_cache takes true or false (or on/off, yes/no), got {text.strip()!r}"
    )
