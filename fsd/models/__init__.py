"""Model families over the shared parallel layers: what a forward pass computes.

Owns: one compact file per family (`opt`, `llama`; Mistral, Qwen2 and Qwen3 are the
Llama family with flags) numerically matching its HuggingFace classes; the
family-independent part in `base.CausalLM` (forward over
the pipeline-stage hooks `embed` / `decoder_layers` / `final_norm`, logits,
HF-named weight loading with tensor-parallel slicing, seeded random init);
`arch.ModelArch` (a model's shape and flags) read from a checkpoint's config.json
by `hf_config`, validated; `presets` (built-in
random-weight models); `registry` (family name -> class); `loader` (a preset or a
local checkpoint directory -> a built model, its tokenizer, dtype and limits;
nothing is ever downloaded).

May import: `fsd.layers`, `fsd.kernels`, and the shared leaves `fsd.config`,
`fsd.errors`, `fsd.tokenizer`. Never `fsd.engine`, `fsd.sched`, `fsd.kv`,
`fsd.server` or the console: a model knows nothing of jobs, scheduling, KV
placement or pipeline stages beyond the layers it holds.
"""
