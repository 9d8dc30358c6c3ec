"""`fsctl top`: the Textual operator console (app.py), fed by the daemon's telemetry.

Layers: `data` folds telemetry into plain data, `source` feeds it from a daemon or a
recording, `render` turns it into rich renderables (shared with `--once`), and the
widgets (`panels`, `jobtable`, `screens`, `dialogs`, `app`) only display it.
"""

from __future__ import annotations

from pathlib import Path


def run(
    endpoint: str,
    telemetry_endpoint: str,
    *,
    timeout: float = 10.0,
    curve: object | None = None,
    once: bool = False,
    replay: Path | None = None,
    hz: float = 4.0,
    speed: float = 1.0,
    token: str | None = None,
) -> None:
    """Run the console (or print one snapshot with `once`); FsdError on bad input.

    `token`: the operator token its control requests carry (None: the client role,
    which may watch but not retune or inject). A recording that cannot be read raises
    FsdError, before the console starts or, for a bad line further on, once it closed.
    """
    if once:
        import sys

        from rich.console import Console

        from fsd.console.top.once import live_view, print_once, replay_view

        if replay is not None:
            view, label = replay_view(replay), f"replay {replay.name}"
        else:
            view, label = live_view(telemetry_endpoint, timeout, curve), telemetry_endpoint
        print_once(view, label, Console(width=None if sys.stdout.isatty() else 160))
        return

    from fsd.console.top.app import ControlTarget, TopApp
    from fsd.console.top.source import LiveSource, ReplaySource, Source

    source: Source
    control = None
    if replay is not None:
        source = ReplaySource(replay, speed)  # reads the first frame: a bad file fails here
    else:
        source = LiveSource(telemetry_endpoint, curve)
        control = ControlTarget(endpoint, timeout, curve, token)
    app = TopApp(source, control, hz=hz)
    app.run()
    if app.error is not None:  # the feed stopped on a bad recording: the CLI's exit 2
        raise app.error
