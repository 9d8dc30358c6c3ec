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
