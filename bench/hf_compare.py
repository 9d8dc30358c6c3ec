"""Greedy decode tokens/s: fsd against HuggingFace transformers `generate`, same model.

    .venv/bin/python bench/hf_compare.py                        # ~100M Llama, batches 1 and 32
    .venv/bin/python bench/hf_compare.py --batches 1 --rounds 3 --profile-fsd 32
    .venv/bin/python bench/hf_compare.py --device cuda --dtype float16 --shape llama-1b  # a GPU

A random Llama of about 100M parameters (hidden 768, 12 layers, 12 query / 4 KV
heads, SwiGLU 2048, vocab 32000, tied head) is written once with transformers
(tests/models/hf_fixtures.py) and loaded by both. Each round times, for each system
in turn (A B A B ...), a generate of 1 new token and one of --new-tokens new tokens
from the same prompts (greedy, EOS ignored); the decode rate of a round is
batch x (new_tokens - 1) / (t_new - t_1), so the prompt's prefill cancels out. The
table gives the medians over rounds, fp32 on the CPU (--dtype), --threads torch
threads (1 by default: the machine is shared). --shape llama-1b writes a random
Llama-3.2-1B-shaped checkpoint instead (hidden 2048, 16 layers, 32/8 heads, vocab
128256; targets on a GPU: fsd >= 3x transformers at batch 1, >= 2x at batch 32). The first round of each system also checks that fsd's
greedy tokens equal transformers'. --profile-fsd B prints torch.profiler's top
operators for fsd's decode at batch B. Writes bench/results/hf-compare-<device>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from machine import describe_machine, machine_slug, table_of, timing_args, write_json  # noqa: E402

from fsd import LLM, SamplingParams  # noqa: E402

MODEL = {
    "vocab_size": 32000,
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
SHAPES = {
    "llama-100m": MODEL,
    "llama-1b": {**MODEL, "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8},
}  # fmt: skip


def write_model(path: Path, shape: dict) -> Path:
    from tests.models.hf_fixtures import make_llama_checkpoint

    if not (path / "config.json").exists():
        make_llama_checkpoint(path, **shape)
    return path


def prompts(batch: int, length: int) -> list[list[int]]:
    return [[(7 * i + 13 * k) % 250 + 3 for k in range(length)] for i in range(batch)]


class HF:
    name = "transformers"

    def __init__(self, path: Path, max_batch: int, device: str, dtype: str) -> None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
        self.device = device
        self.model = model.to(device).eval()

    def generate(self, ids: list[list[int]], new: int) -> list[list[int]]:
        x = torch.tensor(ids, device=self.device)
        with torch.inference_mode():
            out = self.model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        return out[:, x.shape[1] :].tolist()

    def close(self) -> None:
        pass


class Fsd:
    name = "fsd"

    def __init__(self, path: Path, max_batch: int, device: str, dtype: str) -> None:
        self.llm = LLM(
            str(path),
            device=device,
            dtype=dtype,
            num_gpu_blocks=1024,
            num_host_blocks=0,
            max_batch_size=max_batch,
            max_batch_tokens=8192,
            profile="llama3.1-8b-h100",  # a shipped cost model: no calibration at start
        )

    def generate(self, ids: list[list[int]], new: int) -> list[list[int]]:
        params = SamplingParams(max_tokens=new, ignore_eos=True, temperature=0.0)
        return [list(o.token_ids) for o in self.llm.generate(ids, params)]

    def close(self) -> None:
        self.llm.close()


def timed(system, ids: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    out = system.generate(ids, new)
    return time.perf_counter() - start, out


def compare(systems: list, batch: int, args) -> dict:
    ids = prompts(batch, args.prompt_len)
    for s in systems:  # warm up (allocators, first-call paths)
        s.generate(ids, 4)
    rates: dict[str, list[float]] = {s.name: [] for s in systems}
    e2e: dict[str, list[float]] = {s.name: [] for s in systems}
    tokens: dict[str, list[list[int]]] = {}
    for r in range(args.rounds):
        order = systems if r % 2 == 0 else systems[::-1]
        for s in order:
            t1, _ = timed(s, ids, 1)
            tn, out = timed(s, ids, args.new_tokens)
            tokens.setdefault(s.name, out)
            rates[s.name].append(batch * (args.new_tokens - 1) / max(tn - t1, 1e-9))
            e2e[s.name].append(batch * args.new_tokens / tn)
    a, b = tokens["fsd"], tokens["transformers"]
    same = sum(x == y for x, y in zip(a, b, strict=True))
    row = {"batch": batch, "sequences_equal": f"{same}/{batch}"}
    for name in rates:
        row[name] = {
            "decode_tokens_per_s": statistics.median(rates[name]),
            "end_to_end_tokens_per_s": statistics.median(e2e[name]),
            "decode_rounds": rates[name],
        }
    row["ratio"] = row["fsd"]["decode_tokens_per_s"] / row["transformers"]["decode_tokens_per_s"]
    return row


def profile_fsd(fsd: Fsd, batch: int, args, console: Console) -> list[dict]:
    """torch.profiler's top operators (self CPU time) over fsd's decode steps."""
    from torch.profiler import ProfilerActivity, profile

    ids = prompts(batch, args.prompt_len)
    fsd.generate(ids, 4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fsd.generate(ids, args.new_tokens)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    top = [
        {
            "op": e.key,
            "self_ms": e.self_cpu_time_total / 1e3,
            "share": e.self_cpu_time_total / total,
        }
        for e in events[:15]
    ]
    table = Table(title=f"fsd decode at batch {batch}: top operators (self CPU)")
    for col in ("op", "self ms", "share"):
        table.add_column(col, justify="right")
    for t in top:
        table.add_row(t["op"], f"{t['self_ms']:.1f}", f"{100 * t['share']:.1f}%")
    console.print(table)
    return top


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model-dir", default=None, help="where the checkpoint is (written once)")
    ap.add_argument("--profile-fsd", type=int, default=0, help="profile fsd at this batch")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--shape", default="llama-100m", choices=sorted(SHAPES))
    args = timing_args(ap, batches="1,32")
    console = Console()
    shape = SHAPES[args.shape]
    path = Path(args.model_dir or Path(tempfile.gettempdir()) / f"fsd-hf-compare-{args.shape}")
    write_model(path, shape)
    batches = args.batches
    systems = [cls(path, max(batches), args.device, args.dtype) for cls in (Fsd, HF)]
    n_params = sum(p.numel() for p in systems[1].model.parameters())
    rows = [compare(systems, b, args) for b in batches]
    title = (
        f"greedy decode, Llama {n_params / 1e6:.0f}M {args.dtype} on {args.device}, prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens, {args.threads} thread(s): tokens/s (median of "
        f"{args.rounds})"
    )
    columns = "batch | fsd | transformers | fsd / HF | same tokens"
    cells = ("{batch} | {fsd[decode_tokens_per_s]:.1f} | {transformers[decode_tokens_per_s]:.1f}"
             " | {ratio:.2f} | {sequences_equal}")  # fmt: skip
    console.print(table_of(title, columns, cells, rows))
    result = {
        "bench": "fsd vs transformers greedy decode",
        "machine": describe_machine(torch.device(args.device)),
        "model": {**shape, "parameters": n_params, "dtype": args.dtype},
        "settings": {
            k: getattr(args, k) for k in ("prompt_len", "new_tokens", "rounds", "threads")
        },
        "transformers": __import__("transformers").__version__,
        "runs": rows,
    }
    if args.profile_fsd:
        result["fsd_profile"] = profile_fsd(systems[0], args.profile_fsd, args, console)
    for s in systems:
        s.close()
    out = write_json(args.json or f"bench/results/hf-compare-{machine_slug(torch.device(args.device))}.json", result)
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
