"""Parameter sweep: one prompt decoded once per value of one tree parameter, each run against AR (timed before
and after the runs: the faster).

    python -m cli.sweep --param budget --values 4,8,16,32,64,128 [--model M]
        [--prompt TEXT | --dataset humaneval --index 0] [--prompt-format auto|chat|raw] [--max-new-tokens 128]
        [--method ...] [--budget B] [--spine-ratio R] [--depth D] [--gt-threshold auto|chord|C]
        [--sources pld,tr] [--cost-curve SPEC|FILE] [... every decoding option of cli.generate] [--out DIR]

A researcher debugging draft-tree shapes picks one parameter (``PARAMETERS``: node budget B, spine ratio r,
max depth D, GT threshold c, method, draft sources) and a list of values.  Each value's run reports τ (tokens
per verification forward), decode-phase tokens/s, the speedup over AR (AR timed before and after the runs, the
faster timing) and whether its text equals AR's token for token (greedy; in sampling mode texts differ by design).

Values are one comma-separated string: ``4,8,16,32`` (B, D), ``0.3,0.5,auto`` (r; auto = adaptive),
``0,0.1,auto,chord`` (c), ``goose,pld,tr`` (method), ``pld+tr,pld+tr+ptd`` (a source set: names joined by
"+").  The CLI prints a markdown table and one sentence, and writes ``sweep.md``, ``sweep.json`` and
``sweep.html`` (the figure, ``viz/sweep_figure.py``) to ``--out``.  Exit status: 0; 1 when a greedy run
parted from AR by more than a precision tie (``engine/product/runs/lossless.py``); 2 on bad input or a model that cannot
be loaded (one ``error:`` line on stderr, no traceback).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from engine.core.kv_cache import UnsupportedCacheError
from engine.decoding.compiled_cycle import KERNELS
from engine.decoding.config import ConfigError, DecodeConfig
from engine.decoding.cost import CostCurve, load_cost_curve
from engine.product.bench.prompts import DATASETS, DEFAULT_DATA, BenchError, encode, load_prompts
from engine.product.io.options import add_config_options, add_model_options, config_from_args
from engine.product.models.loading import ModelLoadError, load_model, with_forward
from engine.product.runs.lossless import Divergence
from engine.product.runs.run import SPEEDUP_PHASE
from engine.product.runs.sweep.attribution import diagnose
from engine.product.runs.sweep.records import Sweep
from engine.product.runs.sweep.report import markdown_table, summary, to_dict
from engine.product.runs.sweep.runner import run_sweep
from engine.product.runs.sweep.spec import MAX_VALUES, PARAMETERS, SweepSpec
from viz.sweep_figure import sweep_html


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser: the sweep's own options plus ``cli.generate``'s decoding options (the base
    config)."""
    ap = argparse.ArgumentParser(prog="python -m cli.sweep", description=__doc__.splitlines()[0],
                                 allow_abbrev=False)  # whole option names: ``_public_command`` reads them
    ap.add_argument("--param", required=True,
                    help=f"the parameter to sweep: {', '.join(PARAMETERS)} (depth = max_depth)")
    ap.add_argument("--values", required=True,
                    help="comma-separated values, e.g. 4,8,16,32 (B, D), 0.3,auto (r), 0,auto,chord (c), "
                         f"goose,pld (method), pld+tr,pld+tr+ptd (sources); at most {MAX_VALUES}; the swept "
                         "option's own flag is ignored")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt itself")
    src.add_argument("--dataset", choices=tuple(DATASETS), help="a prompt from a set the project ships")
    ap.add_argument("--index", type=int, default=0, help="which prompt of --dataset (0 = the first)")
    add_model_options(ap)
    ap.add_argument("--prompt-format", default=None, choices=("auto", "chat", "raw"),
                    help="chat: one user turn in the chat template; raw: as is; default: the dataset's own format "
                         "(HumanEval raw, the others chat), auto for --prompt (chat when the tokenizer has a template)")
    add_config_options(ap)
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for sweep.md, sweep.json and sweep.html (default: results/sweep-DATE-TIME)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        spec = SweepSpec.parse(args.param, args.values)
        base = config_from_args(args)
        spec.configs(base)  # every value with the other options, before the model loads
        prompt, where = _prompt_text(args)
        curve = load_cost_curve(args.cost_curve) if args.cost_curve else None
        lm = with_forward(load_model(args.model, device=args.device, dtype=args.dtype), args.forward)
        KERNELS.warm()  # the compiled cycle's kernels: compiled once per checkout (about 45 s), loaded after
    except (OSError, ValueError, BenchError, ModelLoadError) as exc:  # ConfigError, CostCurveError: ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prompt_ids = _prompt_ids(lm, args, prompt, base.max_new_tokens)
    lm = lm.for_context(len(prompt_ids) + base.max_new_tokens)  # the path a generation this long runs on
    problem = lm.context_problem(len(prompt_ids), base.max_new_tokens)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"model: {lm.summary()}", file=sys.stderr)
    if curve is None and spec.needs_cost_curve(base):
        curve = lm.curves.shared()  # measured once per machine when absent: not the
        # sweep's time
    lm.warm_up()  # lazy initialisation is not AR's time
    try:
        sweep = _run_printing(lm, prompt_ids, base, spec, curve)
    except UnsupportedCacheError as exc:  # compat.UnsupportedModelError included
        print(f"error: {exc}", file=sys.stderr)
        return 2
    divergences = diagnose(lm.model, prompt_ids, sweep, lm.forward) if not sweep.sampling else {}
    meta = {"model": lm.name, "device": lm.device, **lm.runs.to_dict(),
            "prompt": where, "prompt_tokens": len(prompt_ids), "max_new_tokens": base.max_new_tokens,
            "date": dt.datetime.now().isoformat(timespec="seconds"), "python": platform.python_version(),
            "command": _public_command(argv, lm.name, curve if args.cost_curve else None)}
    text = _report_text(sweep, divergences, lm.tokenizer.decode)
    print(text + f"\nsweep: AR and {len(sweep.runs)} runs in {sweep.seconds:.2f} s (wall; model load excluded)")
    out = args.out or Path("results") / dt.datetime.now().strftime("sweep-%Y%m%d-%H%M%S")
    write_outputs(out, sweep, meta, text, divergences)
    print(f"wrote {out / 'sweep.md'}, sweep.json, sweep.html", file=sys.stderr)
    return 1 if any(d.kind in ("bug", "length") for d in divergences.values()) else 0


def _prompt_text(args: argparse.Namespace) -> tuple[str, str]:
    """The prompt (``--prompt``, or prompt ``--index`` of ``--dataset``) and where it came from, for the meta.

    Raises:
        ConfigError, BenchError: a negative or too large index, an empty prompt, a missing prompt file.
    """
    if args.dataset:
        if args.index < 0:
            raise ConfigError(f"--index must be 0 or more (got {args.index})")
        texts = load_prompts(DEFAULT_DATA, args.dataset, args.index + 1)
        if args.index >= len(texts):
            raise ConfigError(f"{args.dataset} has {len(texts)} prompts: --index {args.index} is past its end")
        return texts[args.index], f"{args.dataset} #{args.index}"
    if not args.prompt.strip():
        raise ConfigError("the prompt is empty")
    return args.prompt, "--prompt"


def _prompt_ids(lm, args: argparse.Namespace, prompt: str, max_new_tokens: int) -> list[int]:
    """``prompt``'s token ids in ``--prompt-format`` (default: the dataset's own format; auto for ``--prompt``)."""
    if args.dataset:
        fmt = DATASETS[args.dataset][2] if args.prompt_format in (None, "auto") else args.prompt_format
        return encode(lm, prompt, fmt, max_new_tokens)
    return lm.encode_prompt(prompt, chat={None: None, "auto": None, "chat": True, "raw": False}[args.prompt_format])


def _run_printing(lm, prompt_ids: list[int], base: DecodeConfig, spec: SweepSpec,
                  curve: CostCurve | None) -> Sweep | None:
    """``run_sweep`` to the end, each finished run (and AR) printed on stderr as it comes; the last state."""
    sweep = None
    for sweep in run_sweep(lm, prompt_ids, base, spec, curve):
        if sweep.runs:
            r = sweep.runs[-1]
            speedup = "–" if r.speedup is None else f"{r.speedup:.2f}×"
            print(f"[{len(sweep.runs)}/{sweep.total}] {r.label}: τ {r.tau:.2f}, {r.tok_per_s:.0f} tok/s, "
                  f"{speedup} AR ({SPEEDUP_PHASE})", file=sys.stderr)
        elif sweep.ar is not None:
            print(f"AR: {sweep.ar.tok_per_s:.0f} tok/s (decode phase)", file=sys.stderr)
    return sweep


def _report_text(sweep: Sweep, divergences: dict[int, Divergence], decode) -> str:
    """The table, the sentence and one line per run that parted from AR (``sweep.md``'s body, also printed)."""
    text = markdown_table(sweep, divergences) + "\n" + summary(sweep, divergences) + "\n"
    for index, d in divergences.items():
        text += f"\n{sweep.runs[index].label}: {d.sentence(decode)}.\n"
    return text


def write_outputs(out: Path, sweep: Sweep, meta: dict, text: str, divergences: dict[int, Divergence]) -> None:
    """``sweep.md`` (meta lines, table, sentence), ``sweep.json`` (``to_dict`` plus meta) and ``sweep.html``
    (the figure, self-contained: ``sweep_figure.sweep_html``) in ``out``, created when missing."""
    out.mkdir(parents=True, exist_ok=True)
    head = (f"# Sweep of {sweep.spec.info.what}\n\n{meta['model']} · {meta['device']} · {meta['dtype']} · "
            f"{meta['prompt']} ({meta['prompt_tokens']} prompt tokens, {meta['max_new_tokens']} new) · "
            f"{meta['date']}\n\n`{meta['command']}`\n\n")
    (out / "sweep.md").write_text(head + text, encoding="utf-8")
    (out / "sweep.json").write_text(json.dumps({"meta": meta, **to_dict(sweep, divergences)}, indent=2) + "\n",
                                    encoding="utf-8")
    (out / "sweep.html").write_text(sweep_html(sweep, meta), encoding="utf-8")


def _public_command(argv: Sequence[str], model: str, curve: CostCurve | None) -> str:
    """The command line as run, with no machine path: ``--out`` left out, ``--model`` as the model's public name,
    ``--cost-curve`` as the curve's spec."""
    words, rest = [], list(argv)
    while rest:
        word = rest.pop(0)
        option, eq, value = word.partition("=")
        if option in ("--out", "--model", "--cost-curve"):
            value = value if eq else (rest.pop(0) if rest else "")
            if option == "--model":
                words += [option, model]
            elif option == "--cost-curve":
                words += [option, curve.spec() if curve is not None else value]
            continue
        words.append(word)
    return shlex.join(["python", "-m", "cli.sweep", *words])


if __name__ == "__main__":
    sys.exit(main())
