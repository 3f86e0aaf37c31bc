"""Hugging Face Transformers models on neuron, checked against the CPU.

    pip install transformers          # not a dependency of neuron-eager
    python examples/hf_transformers.py [--models llama gpt2 ...] [--dtype bf16] [--adaptive]

Each model is built from a small random config (nothing is downloaded), copied to neuron,
and run on both devices: logits and loss in eval mode, greedy `generate` (KV cache on),
then a training step's loss and gradients (dropout off, so both sides compute the same
function). Prints the largest differences and whether generation picked the same tokens.
"""
from __future__ import annotations

import argparse
import copy

import torch

import neuron_eager

try:
    import transformers as tf
except ImportError:  # pragma: no cover - an example's own requirement
    raise SystemExit("this example needs `pip install transformers`")

VOCAB, BATCH, LENGTH = 200, 2, 12
_DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=64)


def _gqa(cls, **extra):
    return lambda: cls(**_DECODER, num_key_value_heads=2, **extra)


# name -> (config factory, model class, whether it generates from input_ids)
MODELS = {
    "gpt2": (lambda: tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                   n_positions=64, bos_token_id=1, eos_token_id=2),
             "GPT2LMHeadModel", True),
    "llama": (_gqa(tf.LlamaConfig), "LlamaForCausalLM", True),
    "qwen2": (_gqa(tf.Qwen2Config), "Qwen2ForCausalLM", True),
    "mistral": (_gqa(tf.MistralConfig, sliding_window=8), "MistralForCausalLM", True),
    "gpt_neox": (lambda: tf.GPTNeoXConfig(**_DECODER), "GPTNeoXForCausalLM", True),
    "phi": (lambda: tf.PhiConfig(**_DECODER), "PhiForCausalLM", True),
    "bert": (lambda: tf.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, vocab_size=VOCAB),
             "BertForMaskedLM", False),
    "t5": (lambda: tf.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
                               vocab_size=VOCAB, decoder_start_token_id=0),
           "T5ForConditionalGeneration", True),
    "bart": (lambda: tf.BartConfig(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                   encoder_layers=2, decoder_layers=2,
                                   encoder_attention_heads=4, decoder_attention_heads=4,
                                   vocab_size=VOCAB, max_position_embeddings=64),
             "BartForConditionalGeneration", True),
}


def _no_dropout(config) -> None:
    for name, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
            setattr(config, name, 0.0)


def _batch(device) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (BATCH, LENGTH), generator=g)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[1, :3] = 0  # left padding in the second row
    return {k: v.to(device) for k, v in
            dict(input_ids=ids, attention_mask=mask, labels=ids.clone()).items()}


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().float() - b.detach().cpu().float()).abs().max().item()


def check(name: str, dtype: torch.dtype, attention: str) -> str:
    make_config, class_name, generates = MODELS[name]
    config = make_config()
    config._attn_implementation = attention
    _no_dropout(config)
    torch.manual_seed(0)
    cpu = getattr(tf, class_name)(config).to(dtype).eval()
    dev = copy.deepcopy(cpu).to("neuron")
    batches = _batch("cpu"), _batch("neuron")
    with torch.no_grad():
        out_cpu, out_dev = cpu(**batches[0]), dev(**batches[1])
    logits = _diff(out_cpu.logits, out_dev.logits)
    same_tokens = "-"
    if generates:
        prompt = [{k: b[k] for k in ("input_ids", "attention_mask")} for b in batches]
        tokens = [m.generate(**p, max_new_tokens=8, do_sample=False, pad_token_id=0)
                  for m, p in zip((cpu, dev), prompt)]
        same_tokens = "same" if torch.equal(tokens[0], tokens[1].cpu()) else "DIFFERENT"
    cpu.train()
    dev.train()
    losses = [m(**b).loss for m, b in zip((cpu, dev), batches)]
    for loss in losses:
        loss.backward()
    pairs = [(p.grad, q.grad) for p, q in zip(cpu.parameters(), dev.parameters())
             if p.grad is not None]
    # relative to the largest gradient: some are ~0 by symmetry (the key bias under softmax)
    grads = max(_diff(g, h) for g, h in pairs) / max(g.abs().max().item() for g, _ in pairs)
    loss = _diff(losses[0], losses[1])
    return (f"{name:9s} {attention:6s} | logits {logits:9.2e} | loss {loss:9.2e}"
            f" | grads (relative) {grads:9.2e} | generate {same_tokens}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--adaptive", action="store_true", help="run neuron in adaptive eager")
    args = parser.parse_args(argv)
    if args.adaptive:
        neuron_eager.adaptive.enable()
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    print(f"transformers {tf.__version__}, {args.dtype}; largest |neuron - CPU|")
    for name in args.models:
        for attention in ("eager", "sdpa"):
            print(check(name, dtype, attention))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
