"""Train the embedded demo model shipped in ``assets/demo-model/``.

A byte-level BPE tokenizer (HF ``tokenizers``) and a small Llama-architecture causal LM
(``transformers.LlamaForCausalLM``, tied embeddings) trained on the Python source of the running
interpreter's standard library -- the only sizeable corpus of code that exists offline on every
machine.  Test suites are excluded and about 5 % of the files (chosen by a seeded shuffle) are held
out for validation.  Nothing in ``assets/datasets`` is ever trained on: those are our benchmarks
(a HumanEval prompt is only *read* at the end, for the sample continuation in the model card).

Usage::

    python scripts/train_demo_model.py --minutes 45 --out assets/demo-model

Runs on CUDA when available, else CPU (about 3k tokens/s on 2 cores for the default size).
The run is bounded by wall-clock minutes, not steps, so the same command fits any machine.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import sysconfig
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

EOS = "<|endoftext|>"
EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "dist-packages"}


def stdlib_files() -> list[Path]:
    """All ``*.py`` files of the interpreter's standard library, test suites excluded, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not (set(p.relative_to(root).parts[:-1]) & EXCLUDED_DIRS)]
    return sorted(files)


def read_texts(files: list[Path]) -> list[str]:
    texts = []
    for p in files:
        try:
            texts.append(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_stream(tok: Tokenizer, texts: list[str], eos_id: int) -> torch.Tensor:
    """Concatenate documents, each followed by EOS. Returns (n_tokens,) int64."""
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def heldout_loss(model, data: torch.Tensor, seq_len: int, device: str, max_windows: int = 64) -> float:
    model.eval()
    n = min(max_windows, (len(data) - 1) // seq_len)
    losses = []
    for i in range(0, n, 8):
        idx = torch.arange(i, min(i + 8, n)) * seq_len
        x = torch.stack([data[j : j + seq_len] for j in idx]).to(device)  # (b, T)
        losses.append(model(input_ids=x, labels=x).loss.item())
    model.train()
    return sum(losses) / len(losses)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="assets/demo-model")
    ap.add_argument("--minutes", type=float, default=45.0, help="wall-clock training budget")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    args = ap.parse_args()

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hardware = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"

    files = stdlib_files()
    random.Random(args.seed).shuffle(files)
    n_val = max(1, round(0.05 * len(files)))
    val_files, train_files = files[:n_val], files[n_val:]
    train_texts, val_texts = read_texts(train_files), read_texts(val_files)
    print(f"stdlib files: {len(train_texts)} train, {len(val_texts)} held out", flush=True)

    tok = train_tokenizer(train_texts, args.vocab)
    eos_id = tok.token_to_id(EOS)
    train_ids = encode_stream(tok, train_texts, eos_id)
    val_ids = encode_stream(tok, val_texts, eos_id)
    print(f"tokens: {len(train_ids):,} train, {len(val_ids):,} held out", flush=True)

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=args.d_model,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=2048,  # > training seq_len; RoPE extrapolates modestly for longer demos
        tie_word_embeddings=True,  # halves the parameter count at this size
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    model = LlamaForCausalLM(config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params:,}", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    budget_s = args.minutes * 60
    warmup_s = min(60.0, 0.05 * budget_s)
    t0 = time.time()
    step, tokens_seen, last_report = 0, 0, t0
    gen = torch.Generator().manual_seed(args.seed)
    model.train()
    while (elapsed := time.time() - t0) < budget_s:
        # LR schedule on wall-clock time: linear warm-up, cosine decay to 10 % at the budget's end.
        frac = elapsed / budget_s
        lr = args.lr * min(1.0, elapsed / warmup_s) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_ids) - args.seq_len - 1, (args.batch,), generator=gen)
        x = torch.stack([train_ids[s : s + args.seq_len] for s in starts]).to(device)  # (batch, T)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += x.numel()
        if time.time() - last_report > 120:
            last_report = time.time()
            rate = tokens_seen / (last_report - t0)
            print(f"step {step} t={elapsed/60:.1f}min loss={loss.item():.3f} lr={lr:.2e} {rate:.0f} tok/s", flush=True)
    train_s = time.time() - t0
    val_loss = heldout_loss(model, val_ids, args.seq_len, device)
    print(f"done: {step} steps, {tokens_seen:,} tokens in {train_s/60:.1f} min; held-out loss {val_loss:.3f} "
          f"(ppl {math.exp(val_loss):.1f})", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu").eval()
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=eos_id, do_sample=False
    )
    model.save_pretrained(out, safe_serialization=True)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS,
                                     unk_token=None, model_max_length=2048)
    hf_tok.save_pretrained(out)

    sample = greedy_sample(model, hf_tok)
    stats = {
        "parameters": n_params, "train_tokens": len(train_ids), "heldout_tokens": len(val_ids),
        "train_files": len(train_texts), "heldout_files": len(val_texts), "steps": step,
        "tokens_seen": tokens_seen, "train_minutes": round(train_s / 60, 1), "hardware": hardware,
        "heldout_loss": round(val_loss, 4), "python": sys.version.split()[0], "torch": torch.__version__,
        "seed": args.seed, "args": vars(args),
    }
    (out / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    (out / "README.md").write_text(model_card(stats, sample, config))
    print(f"saved to {out}", flush=True)


def greedy_sample(model, tok, max_new_tokens: int = 64) -> dict:
    """Greedy continuation of the first HumanEval prompt (read only, never trained on)."""
    path = Path(__file__).resolve().parents[1] / "assets" / "datasets" / "humaneval" / "HumanEval.jsonl"
    prompt = json.loads(path.read_text().splitlines()[0])["prompt"] if path.exists() else "def fib(n):\n"
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return {"prompt": prompt, "continuation": tok.decode(out[0, ids.shape[1]:])}


def model_card(stats: dict, sample: dict, config: LlamaConfig) -> str:
    return f"""---
license: psf-2.0
library_name: transformers
pipeline_tag: text-generation
---
# goose-lens demo model

A tiny Llama-architecture causal LM embedded in goose-lens so the demo, the CLI and the tests run
offline on a laptop CPU. It writes Python-looking code; it is a teaching and test model, not a useful
assistant. Produced by `python scripts/train_demo_model.py --minutes {stats['args']['minutes']:g}`.

| | |
|---|---|
| architecture | `LlamaForCausalLM`, {config.num_hidden_layers} layers, d={config.hidden_size}, {config.num_attention_heads} heads, FFN {config.intermediate_size}, tied embeddings |
| parameters | {stats['parameters']:,} |
| tokenizer | byte-level BPE (HF `tokenizers`), vocabulary {config.vocab_size}, `<|endoftext|>` = EOS, no chat template |
| data | Python {stats['python']} standard library source (`*.py`, test suites excluded): {stats['train_files']} files / {stats['train_tokens']:,} tokens for training, {stats['heldout_files']} files / {stats['heldout_tokens']:,} tokens held out (seeded 5 % split) |
| training | {stats['steps']} steps of {stats['args']['batch']} x {stats['args']['seq_len']} tokens ({stats['tokens_seen']:,} tokens), AdamW, lr {stats['args']['lr']}, cosine, seed {stats['seed']} |
| time and hardware | {stats['train_minutes']} min on {stats['hardware']}, torch {stats['torch']} |
| held-out loss | {stats['heldout_loss']} nats/token (perplexity {math.exp(stats['heldout_loss']):.1f}) |
| license | PSF-2.0 (the training data is the Python standard library, PSF license) |

## Greedy continuation of HumanEval/0 (read only for this sample; never trained on)

```python
{sample['prompt']}{sample['continuation']}
```
"""


if __name__ == "__main__":
    main()
