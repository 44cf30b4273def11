"""Long contexts on llama.cpp's kernels: what an AR step costs per KV cache and attention kernel at several cached
lengths (``--speed``), and how far a tree row's logits move from its AR step on the path without flash attention
(``--ties``): the figures behind docs/results.md, "Long contexts: the KV cache and the attention kernel", and
``GgmlNoFlashPath.TIE_LOGITS``.

    python scripts/long_context.py --speed [--lengths 128,512,1024,1536,2000] [--rounds 5]
    python scripts/long_context.py --ties [--data DIR] [--tokens 200]

``--speed``: one llama context per configuration on the model's GGUF file (2 threads or the physical cores), the
context filled to each length with the same token ids, then one-row decodes at that length, the configurations
interleaved round by round (8 steps each), medians in ms; run it alone.  ``--ties``: each prompt (the page's presets,
and every prompt of ``DIR``'s humaneval and mt_bench sets) decoded AR step by step on ``llamacpp-noflash``, then
again as 16-row chains; the largest |Δlogit| and the largest move of the gap between AR's token and any other.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engine.core.forward import llamacpp  # noqa: E402
from engine.core.forward.llamacpp import LlamaModel, library, physical_cores  # noqa: E402
from engine.core.forward.seam import round_up  # noqa: E402
from engine.core.tree import DraftTree, Source  # noqa: E402
from engine.product.models.loading import load_model  # noqa: E402
from engine.product.models.named import SMOLLM2, ensure_gguf  # noqa: E402

#: name: (key type, value type, flash attention, one cell pool for many sequences, sequence ids)
CONFIGS = {
    "Q8_0/F16, flash (llamacpp)": ("Q8_0", "F16", True, True, 18),
    "Q8_0/Q8_0, flash (llamacpp-q8cache)": ("Q8_0", "Q8_0", True, True, 18),
    "F16/F16, flash": ("F16", "F16", True, True, 18),
    "Q8_0/F16, no flash (llamacpp-noflash)": ("Q8_0", "F16", False, True, 18),
    "F16/F16, no flash": ("F16", "F16", False, True, 18),
    "F16/F16, no flash, 1 sequence (llama.cpp's AR)": ("F16", "F16", False, False, 1),
}


class _Lib:
    """llama-cpp-python's module with the context's flash attention and cell pool set as a configuration asks."""

    def __init__(self, real, unified: bool) -> None:
        self.real, self.unified = real, unified

    def __getattr__(self, name):
        return getattr(self.real, name)

    def llama_init_from_model(self, model, params):
        params.kv_unified = self.unified
        return self.real.llama_init_from_model(model, params)


def speed(lengths: list[int], rounds: int) -> None:
    lib, gguf = library(), ensure_gguf(SMOLLM2)
    model, threads = LlamaModel(lib, gguf), physical_cores()
    ids = np.random.default_rng(0).integers(100, 40000, size=max(lengths) + 64).astype(np.int32)
    n_ctx = round_up(max(lengths) + 64, llamacpp.CTX_STEP)
    contexts = {}
    for name, (k, v, flash, unified, n_seq) in CONFIGS.items():
        kind = llamacpp.ContextKind(_Lib(lib, unified), model, threads, flash, (k, v))
        contexts[name] = llamacpp.LlamaContext(kind, n_ctx, llamacpp.PREFILL_CHUNK, n_seq)

    def fill(ctx, n: int) -> None:
        ctx.clear()
        for s in range(0, n, ctx.n_batch):
            m = min(ctx.n_batch, n - s)
            ctx.tokens[:m], ctx.pos[:m], ctx.n_seq_id[:m], ctx.seq_ids[:m, 0] = ids[s:s + m], np.arange(s, s + m), 1, 0
            ctx.decode(m)

    def step(ctx, at: int) -> float:
        ctx.tokens[0], ctx.pos[0], ctx.n_seq_id[0], ctx.seq_ids[0, 0] = ids[at], at, 1, 0
        start = time.perf_counter()
        ctx.decode(1)
        return (time.perf_counter() - start) * 1000

    ms = {(name, n): [] for name in CONFIGS for n in lengths}
    for n in lengths:
        for ctx in contexts.values():
            fill(ctx, n)
        for _ in range(rounds):
            for name, ctx in contexts.items():
                ms[(name, n)] += [step(ctx, n + s) for s in range(8)]
                ctx.seq_rm(0, n, -1)
    print(f"{model.weight_type} · {threads} threads · AR step ms over n cached cells, medians of {rounds} x 8\n")
    print("| KV cache, attention | " + " | ".join(map(str, lengths)) + " |\n|---|" + "---|" * len(lengths))
    for name in CONFIGS:
        print(f"| {name} | " + " | ".join(f"{statistics.median(ms[(name, n)]):.2f}" for n in lengths) + " |")


def ties(data: Path | None, tokens: int) -> None:
    from page.presets import PRESETS

    lm = load_model("smollm2", dtype="fp32")
    path = llamacpp.GgmlNoFlashPath(lm.model, ensure_gguf(SMOLLM2), threads=2)
    texts = [p["prompt"] for p in PRESETS]
    for name in ("humaneval", "mt_bench") if data else ():
        for f in sorted((data / name).glob("*.jsonl")):
            for line in f.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                texts.append(row.get("prompt") or row["turns"][0])
    worst = worst_gap = 0.0
    for text in texts:
        ids = lm.tokenizer(text)["input_ids"]
        f = path.open(len(ids) + tokens + 32, 32)
        rows, out = [f.prefill(ids)[-1].clone()], []
        for _ in range(tokens):
            out.append(int(rows[-1].argmax()))
            rows.append(f.verify(DraftTree.root_only(out[-1]))[0].clone())
            f.commit([0])
        step = torch.stack(rows[1:])  # (tokens, |V|): row k follows out[k]
        g = path.open(len(ids) + tokens + 32, 32)
        g.prefill(ids)
        chains = []
        for s in range(0, tokens, 16):
            chunk = out[s:s + 16]
            chains.append(g.verify(DraftTree.chain(chunk, Source.declare("probe"))).clone())
            g.commit(list(range(len(chunk))))
        got = torch.cat(chains)  # (tokens, |V|)
        top = step.argmax(-1, keepdim=True)
        moved = ((got - got.gather(1, top)) - (step - step.gather(1, top))).abs().max().item()
        delta = (got - step).abs().max().item()
        worst, worst_gap = max(worst, delta), max(worst_gap, moved)
        print(f"prompt of {len(ids)} tokens: max |Δlogit| {delta:.3f}, max gap move {moved:.3f}", flush=True)
    print(f"\n{len(texts)} prompts x {tokens} positions: max |Δlogit| {worst:.3f}, max gap move {worst_gap:.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--ties", action="store_true")
    ap.add_argument("--lengths", default="128,512,1024,1536,2000")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args(argv)
    if args.speed:
        speed([int(x) for x in args.lengths.split(",")], args.rounds)
    if args.ties:
        ties(args.data, args.tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
