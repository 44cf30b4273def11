"""How far a batched forward's logits move from AR's one-token step: the data behind ``lossless.TIE_ULPS``.

    python scripts/tie_ulps.py [--model smollm2] [--dtype bf16] [--limit 5] [--max-new-tokens 96] [--rows 16]

For each prompt (HumanEval raw + GSM8K chat, the packaged prompt sets), AR generates greedily with
``generate(output_logits=True)``: its own one-token logits at every position.  The same positions are then
scored the way a verification forward scores a chain: ``--rows`` tokens at a time over the KV cache.  At
every position the script compares the gap between AR's top token and each of the next 4 tokens, in ulps of
the dtype at the top logit's magnitude, in the two forwards: a near-tie flips when the gap changes by more
than the gap itself.  It prints the distribution of |Δgap| in ulps; ``TIE_ULPS`` must be at least its max.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.forward import EagerPath  # noqa: E402
from engine.core.tree import DraftTree, Source  # noqa: E402
from engine.product.bench.prompts import DEFAULT_DATA, encode, load_prompts  # noqa: E402
from engine.product.models.loading import load_model  # noqa: E402
from engine.product.runs.lossless import ulp  # noqa: E402


@torch.no_grad()
def shifts(lm, ids: list[int], max_new_tokens: int, rows: int) -> list[float]:
    """|Δgap| in ulps at every generated position and each of the 4 runners-up."""
    model = lm.model
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    step = torch.stack([x[0] for x in out.logits])  # (N, |V|) AR's own steps
    new = out.sequences[0, len(ids):].tolist()
    forward = EagerPath(model).open(len(ids) + len(new) + rows, rows)
    forward.prefill(ids[:-1])
    seq, batch = [ids[-1], *new[:-1]], []  # row j predicts new[j]
    for start in range(0, len(seq), rows):
        chunk = seq[start:start + rows]  # a chain: each row sees the rows before it, as a causal forward
        batch.append(forward.verify(DraftTree.chain(chunk, Source.ROOT)))
        forward.commit(list(range(len(chunk))))
    batch = torch.cat(batch)  # (N, |V|) the same positions, scored ``rows`` at a time
    found = []
    for a, b in zip(step.float(), batch.float()):
        top = a.topk(5).indices
        unit = ulp(float(a[top[0]]), model.dtype)
        for t in top[1:]:
            found.append(abs(float((a[top[0]] - a[t]) - (b[top[0]] - b[t]))) / unit)
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rows", type=int, default=16)
    args = ap.parse_args(argv)
    lm = load_model(args.model, device="cpu", dtype=args.dtype)
    found: list[float] = []
    for dataset, fmt in (("humaneval", "raw"), ("gsm8k", "chat")):
        for text in load_prompts(DEFAULT_DATA, dataset, args.limit):
            found += shifts(lm, encode(lm, text, fmt, args.max_new_tokens), args.max_new_tokens, args.rows)
    found.sort()
    q = lambda p: found[min(len(found) - 1, int(p * len(found)))]  # noqa: E731
    print(f"{lm.describe()}: {len(found)} gaps (AR top-1 vs each of the next 4) at {len(found) // 4} positions, "
          f"batched {args.rows} rows vs one-token step")
    print(f"|Δgap| in ulps: median {statistics.median(found):.2f}, p99 {q(0.99):.2f}, p99.9 {q(0.999):.2f}, "
          f"max {found[-1]:.2f}; share 0: {sum(f == 0 for f in found) / len(found):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
