"""`fsd generate` as a user runs it: a real process, streamed text, clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest


def fsd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsd.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_generate_streams_the_same_text_as_the_offline_api():
    from fsd import LLM, SamplingParams

    proc = fsd("generate", "Hello", "--max-tokens", "12", "--ignore-eos", "--stats")
    assert proc.returncode == 0, proc.stderr
    expected = LLM("tiny").generate("Hello", SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert proc.stdout == expected.text + "\n"
    assert "12 tokens, finish=length" in proc.stderr
    # a temperature below the greedy floor used to divide the logits into inf: greedy now
    tiny = fsd("generate", "Hello", "--max-tokens", "12", "--ignore-eos", "--temperature", "1e-300")
    assert tiny.returncode == 0, tiny.stderr
    assert tiny.stdout == expected.text + "\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-17"], "unknown model 'gpt-17'"),
        (["--model", "/nonexistent/dir"], "/nonexistent/dir"),
        (["--top-p", "0"], "top_p must be in (0, 1]"),
        (["--temperature", "nan"], "temperature must be"),  # the engine thread died of it
        (["--block-size", "12"], "block_size must be a power of two"),
    ],
)
def test_bad_input_is_one_clear_line_not_a_traceback(args, message):
    proc = fsd("generate", "x", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_presets_lists_the_embedded_default():
    proc = fsd("presets")
    assert proc.returncode == 0
    assert proc.stdout.split()[0] == "tiny"


def test_a_config_error_keeps_its_section_name(tmp_path):
    toml = tmp_path / "fsd.toml"
    toml.write_text("[server]\nmax_batch_szie = 3\n")
    proc = fsd("start", "--foreground", "--config", str(toml), "--state-dir", str(tmp_path / "s"))
    assert proc.returncode == 2
    assert "unknown key 'max_batch_szie' in [server]" in proc.stderr  # not eaten as markup
    assert "Traceback" not in proc.stderr


def test_start_in_the_background_forwards_the_given_options_by_their_flags(tmp_path, monkeypatch):
    """The child `fsd start --foreground` gets each option given here under its own flag
    (typer's), the config fields go to build_configs by name, --wait stays here."""
    from typer.testing import CliRunner

    from fsd import daemon
    from fsd.cli import app

    seen = {}

    def start_background(argv, server_cfg, wait):
        seen.update(argv=argv, cfg=server_cfg, wait=wait)
        return 4242

    monkeypatch.setattr(daemon, "start_background", start_background)
    state = str(tmp_path / "s")
    args = ["start", "--max-batch-size", "4", "--kv-policy", "defer", "--telemetry-hz", "2.5"]
    out = CliRunner().invoke(app, [*args, "--state-dir", state, "--wait", "7"])
    assert out.exit_code == 0, out.output
    assert "fsd started: pid 4242" in out.stdout
    argv = seen["argv"]
    pairs = dict(zip(argv[::2], argv[1::2], strict=True))
    assert pairs == {
        "--max-batch-size": "4",
        "--kv-policy": "defer",
        "--telemetry-hz": "2.5",
        "--state-dir": state,
        "--log-level": "info",
    }
    assert seen["wait"] == 7.0 and seen["cfg"].telemetry_hz == 2.5
    # a boolean field goes as its own flag (--x or --no-x), and the child parses it so
    flags = ["--no-cuda-graphs", "--schedule-ahead"]
    out = CliRunner().invoke(app, ["start", *flags, "--state-dir", state])
    assert out.exit_code == 0, out.output
    assert "--no-cuda-graphs" in seen["argv"] and "--schedule-ahead" in seen["argv"]
    import typer

    start = typer.main.get_command(app).commands["start"]  # type: ignore[attr-defined]
    child = start.make_context("start", ["--foreground", *seen["argv"]])
    assert child.params["cuda_graphs"] is False and child.params["schedule_ahead"] is True
    bad = CliRunner().invoke(app, ["start", "--state-dir", state, "--wait", "0"])
    assert bad.exit_code == 2 and bad.stderr == "error: --wait must be > 0 seconds, got 0.0\n"


def test_fsd_and_fsctl_print_their_version():
    import importlib.metadata

    from typer.testing import CliRunner

    from fsd.cli import app as fsd_app
    from fsd.console.cli import app as fsctl_app

    version = importlib.metadata.version("fsd")
    for app, prog in ((fsd_app, "fsd"), (fsctl_app, "fsctl")):
        out = CliRunner().invoke(app, ["--version"])
        assert out.exit_code == 0 and out.stdout == f"{prog} {version}\n"
    assert fsd("--version").stdout == f"fsd {version}\n"  # as a user runs it
