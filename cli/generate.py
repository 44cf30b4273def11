"""Headless CLI: run one generation and print a JSON summary.

    python -m cli.generate --prompt-file F --max-new-tokens N [--model M] [--budget B]
        [--spine-ratio R] [--depth D] [--gt-threshold auto|chord|C] [--cost-curve SPEC|FILE]
        [--method goose|pld|tr|ptd|suffix|vllm-ngram|vllm-suffix|sglang-ngram|llamacpp-ngram|iso3|iso5|ar]
        [--drafter 'NAME=VALUE, ...'] [--sources pld,tr,ptd,suffix] [--walk-priority pld,suffix,ptd,tr]
        [--temperature T --top-p P --top-k K --seed S --verifier tree|hsd]
        [--check-lossless] [--json]

With ``--check-lossless`` (greedy only) the token ids are compared with greedy AR of the same weights on the same
kernels (``engine.product.runs.reference.lossless_reference``): ``model.generate(do_sample=False)`` where the
transformers model runs, AR on the same path where llama.cpp's kernels run the GGUF file's own weights.  In fp32, and
on llama.cpp's path (its rows are bit-identical in any batch), ``lossless`` is true iff they are identical.  In half
precision a batched verification forward rounds differently from a one-token AR step, so a near-tie may flip: the
first difference is attributed (``engine.product.runs.lossless.attribute``) and reported as ``divergence``;
``lossless`` stays true for a *precision tie* and is false for a bug.  ``dtype``, ``forward_path`` and ``weights``
say what ran (``engine.product.models.what_runs``): on llama.cpp's path ``dtype`` is the file's type, e.g. "Q4_1".
The JSON result carries the cost curve the run read (``cost_curve``: id, spec, values) and the serving
engine's configuration that reproduces the method's drafter, or the nearest one (``serve``: engine, flags,
command, what differs; ``engine.product.io.deploy``);
``--cost-curve`` with that spec, or with the result file itself, reproduces the run's trees exactly on
any machine.  Sampling (``--temperature`` > 0) is lossless in distribution, which a single run
cannot show: tests/test_sampling.py checks it statistically.  Exit status: 0 on
success, 1 when the lossless check fails (any difference in fp32, a bug in half precision), 2 on bad input
(message on stderr, no traceback).
"""
from __future__ import annotations

import argparse
import json
import sys

from engine.core.kv_cache import UnsupportedCacheError
from engine.decoding.compiled_cycle import KERNELS
from engine.decoding.config import ConfigError
from engine.decoding.cost import load_cost_curve
from engine.product.io.deploy import serving_dict
from engine.product.io.options import config_from_args, generate_parser
from engine.product.models.loading import ModelLoadError, load_model, tqdm_progress, with_forward
from engine.product.runs.decoder import make_decoder
from engine.product.runs.lossless import attribute
from engine.product.runs.metrics import summarize
from engine.product.runs.reference import lossless_reference


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return generate_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        prompt = args.prompt if args.prompt is not None else args.prompt_file.read_text(encoding="utf-8")
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        config = config_from_args(args)
        if args.check_lossless and config.sampling:
            raise ValueError("--check-lossless compares token ids with greedy decoding; use --temperature 0 "
                             "(sampling is lossless in distribution: see tests/test_sampling.py)")
        curve = load_cost_curve(args.cost_curve) if args.cost_curve else None
        lm = load_model(args.model, device=args.device, dtype=args.dtype, progress=tqdm_progress("model"))
        lm = with_forward(lm, args.forward)
    except (OSError, ValueError, ConfigError, ModelLoadError) as exc:  # CostCurveError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prompt_ids = lm.encode_prompt(prompt, chat={"auto": None, "chat": True, "raw": False}[args.prompt_format])
    lm = lm.for_context(len(prompt_ids) + config.max_new_tokens)  # the path a generation this long runs on
    KERNELS.warm()  # the compiled cycle's kernels: compiled once per checkout (about 45 s), loaded after
    print(f"model: {lm.summary()}", file=sys.stderr)
    problem = lm.context_problem(len(prompt_ids), config.max_new_tokens)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        decoder = make_decoder(lm, config, lm.eos_token_ids, cost_curve=curve)
        traces = list(decoder.generate(prompt_ids))
    except UnsupportedCacheError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tokens = [t for tr in traces for t in tr.new_tokens]
    result = {"model": lm.name, "device": lm.device, **lm.runs.to_dict(), "dtype_reason": lm.dtype_reason,
              "method": args.method, "prompt_tokens": len(prompt_ids),
              "gt_threshold": decoder.config.gt.threshold, "config": decoder.config.to_dict(),
              "cost_curve": decoder.cost_curve.to_dict() if decoder.cost_curve is not None else None,
              "serve": serving_dict(config),
              **summarize(traces).to_dict(), "text": lm.tokenizer.decode(tokens), "token_ids": tokens}
    if args.check_lossless:
        result |= check_lossless(lm, prompt_ids, tokens, args.max_new_tokens)
    if not args.json:
        print(result["text"])
    print(json.dumps(result, indent=None if args.json else 2))
    return 1 if result.get("lossless") is False else 0


def check_lossless(lm, prompt_ids: list[int], tokens: list[int], max_new_tokens: int) -> dict:
    """``--check-lossless``: the run's ``tokens`` against the greedy output of the same weights on the same kernels
    (``lossless_reference``), the first difference attributed (a tie or a bug, said on stderr); returns the result's
    {"lossless", "divergence"}."""
    ref = lossless_reference(lm, prompt_ids, max_new_tokens)
    found = attribute(lm.model, prompt_ids, ref, tokens, path=lm.forward)  # None when the ids are identical
    # fp32 and llama.cpp's rows are exact (no tolerance at all); in half precision a precision tie may part
    lossless = found is None or (found.kind == "precision tie" and not found.exact)
    if found is not None:
        verdict = "" if lossless else "LOSSLESS VIOLATION: "
        if found.exact:
            verdict += f"({lm.runs.label} allows no difference) "
        print(verdict + found.sentence(lm.tokenizer.decode), file=sys.stderr)
    return {"lossless": lossless, "divergence": found.to_dict() if found is not None else None}


if __name__ == "__main__":
    sys.exit(main())
