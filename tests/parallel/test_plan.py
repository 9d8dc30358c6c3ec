"""Stage splitting, stage weight selection and step plans (no Ray needed)."""

from __future__ import annotations

import pytest
import torch

from fsd.engine.plan import build_plan, unorder
from fsd.engine.stage import stage_spans, stage_weights
from fsd.errors import ConfigError
from fsd.jobs import Job, SamplingParams
from fsd.kv.swap import SwapOp


def test_layers_split_evenly_with_the_extra_ones_first():
    spans = stage_spans(5, 2)
    assert [(s.start, s.end) for s in spans] == [(0, 3), (3, 5)]
    assert spans[0].first and not spans[0].last and spans[1].last
    assert [(s.start, s.end) for s in stage_spans(4, 4)] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ConfigError, match="num_layers"):
        stage_spans(2, 3)


def test_a_stage_loads_its_layers_renumbered_and_every_shared_tensor():
    span = stage_spans(4, 2)[1]
    names = ["model.embed_tokens.weight", "model.layers.1.mlp.up_proj.weight",
             "model.layers.2.mlp.up_proj.weight", "model.layers.3.input_layernorm.weight",
             "model.norm.weight"]  # fmt: skip
    got = [n for n, _ in stage_weights(((n, torch.zeros(1)) for n in names), span)]
    assert got == ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
                   "model.layers.1.input_layernorm.weight", "model.norm.weight"]  # fmt: skip


def test_a_plan_puts_decodes_first_and_maps_results_back():
    free = SamplingParams(max_tokens=4, ignore_eos=True)
    held = SamplingParams(max_tokens=4, min_tokens=3)  # EOS (9) banned for 3 tokens
    prefill = Job(prompt_token_ids=[1, 2, 3], params=free, job_id="p")
    decode = Job(prompt_token_ids=[4, 5], params=held, job_id="d")
    decode.output_token_ids.append(6)
    decode.num_computed_tokens = 2
    prefill.block_table, decode.block_table = [7], [3]
    prefill.step_tokens, decode.step_tokens = 3, 1  # as the scheduler would set them
    ops = [SwapOp(None, "in", [1], [2], sync=True), SwapOp(None, "out", [5], [6], sync=True)]
    plan = build_plan(1, [prefill, decode], ops, [], eos_ids=(9,), forget=["gone"])
    assert plan.order == (1, 0) and plan.query_lens == (1, 3)
    assert plan.input_ids == (6, 1, 2, 3) and plan.positions == (2, 0, 1, 2)
    assert plan.block_tables == ((3,), (7,)) and plan.banned == ((9,), ())
    assert plan.job_ids == ("d", "p") and plan.params == (held, free)
    assert plan.forget == ("gone",)
    # in the scheduler's order: a later copy may write the blocks an earlier one read
    assert [s.direction for s in plan.sync_swaps] == ["in", "out"]
    assert unorder(plan, [60, 10]) == [10, 60]
