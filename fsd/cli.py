"""`fsd`: the command line of the serving daemon."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

from fsd.errors import FsdError

app = typer.Typer(help="fsd: a FastServe-style LLM serving daemon.", no_args_is_help=True)
err = Console(stderr=True)


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="Prompt text.")],
    model: Annotated[
        str, typer.Option(help="Preset name or local HuggingFace directory.")
    ] = "tiny",
    max_tokens: Annotated[int, typer.Option(help="Most tokens to generate.")] = 64,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Keep the k most likely tokens (0 = all).")] = 0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = 1.0,
    seed: Annotated[Optional[int], typer.Option(help="Seed of this request's draws.")] = None,  # noqa: UP045
    stop: Annotated[Optional[list[str]], typer.Option(help="Stop string (repeatable).")] = None,  # noqa: UP045
    ignore_eos: Annotated[bool, typer.Option(help="Keep going past EOS.")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, float32, float16 or bfloat16.")] = "auto",
    num_gpu_blocks: Annotated[Optional[int], typer.Option(help="KV blocks on the device.")] = None,  # noqa: UP045
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    stats: Annotated[bool, typer.Option(help="Print timings to stderr at the end.")] = False,
) -> None:
    """Generate from PROMPT in this process, streaming tokens to stdout."""
    from fsd.jobs import SamplingParams
    from fsd.llm import LLM

    try:
        llm = LLM(
            model=model,
            device=device,
            dtype=dtype,
            num_gpu_blocks=num_gpu_blocks,
            block_size=block_size,
        )
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop=tuple(stop or ()),
            ignore_eos=ignore_eos,
        )
        final = None
        for delta in llm.stream(prompt, params):
            sys.stdout.write(delta.new_text)
            sys.stdout.flush()
            final = delta.output
        sys.stdout.write("\n")
    except FsdError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
    if stats and final is not None:
        n = len(final.token_ids)
        err.print(
            f"{n} tokens, finish={final.finish_reason}, ttft={final.ttft * 1e3:.1f} ms, "
            f"total={final.latency * 1e3:.1f} ms, {n / max(final.latency, 1e-9):.1f} tok/s"
        )


@app.command()
def presets() -> None:
    """List the built-in model presets (random weights, byte-level tokenizer)."""
    from fsd.models.presets import PRESETS

    for name, preset in PRESETS.items():
        arch = preset.arch
        typer.echo(
            f"{name:12s} {arch.family:6s} layers={arch.num_layers} hidden={arch.hidden_size} "
            f"heads={arch.num_heads}/{arch.num_kv_heads}"
        )


@app.command()
def version() -> None:
    """Print the fsd version."""
    from fsd import __version__

    typer.echo(__version__)


if __name__ == "__main__":
    app()
