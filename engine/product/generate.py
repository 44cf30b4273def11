"""Headless CLI: run one generation and print a JSON summary.

    python -m engine.product.generate --prompt-file F --max-new-tokens N [--model M] [--budget B]
        [--spine-ratio R] [--depth D] [--gt-threshold auto|chord|C] [--cost-curve SPEC|FILE]
        [--method goose|pld|tr|ptd|suffix|vllm-ngram|vllm-suffix|sglang-ngram|llamacpp-ngram|iso3|iso5|ar]
        [--drafter 'NAME=VALUE, ...'] [--sources pld,tr,ptd,suffix] [--walk-priority pld,suffix,ptd,tr]
        [--temperature T --top-p P --top-k K --seed S --verifier tree|hsd]
        [--check-lossless] [--json]

With ``--check-lossless`` (greedy only) the token ids are compared with
``model.generate(do_sample=False)`` on the same prompt and length.  In fp32 ``lossless`` is true iff they
are identical.  In half precision a batched verification forward rounds differently from a one-token AR
step, so a near-tie may flip: the first difference is attributed (``engine.product.lossless.attribute``)
and reported as ``divergence``; ``lossless`` stays true for a *precision tie* and is false for a bug.
The JSON result carries the cost curve the run read (``cost_curve``: id, spec, values) and the serving
engine's configuration that reproduces the method's drafter, or the nearest one (``serve``: engine, flags,
command, what differs; ``engine.product.deploy``);
``--cost-curve`` with that spec, or with the result file itself, reproduces the run's trees exactly on
any machine.  Sampling (``--temperature`` > 0) is lossless in distribution, which a single run
cannot show: tests/test_sampling.py checks it statistically.  Exit status: 0 on
success, 1 when the lossless check fails (any difference in fp32, a bug in half precision), 2 on bad input
(message on stderr, no traceback).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from ..core.kv_cache import UnsupportedCacheError
from ..decoding.config import FLAT_NAMES, PRESETS, SETTINGS, SOURCES, ConfigError, DecodeConfig, Setting
from ..decoding.cost import load_cost_curve
from .decoding import make_decoder
from .deploy import drafter_text, serving_dict, with_drafter
from .loading import ModelLoadError, add_model_options, load_model, tqdm_progress, with_forward
from .lossless import attribute
from .metrics import summarize
from .reference import greedy_reference


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser.  An option whose ``dest`` is a ``DecodeConfig`` setting's flat name (``FLAT_NAMES``) sets
    it (``config_from_args``); ``command_line`` writes a config back as these options."""
    ap = argparse.ArgumentParser(prog="python -m engine.product.generate", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-file", type=Path, help="UTF-8 text file holding the prompt")
    src.add_argument("--prompt", help="the prompt itself")
    add_model_options(ap)
    ap.add_argument("--prompt-format", default="auto", choices=("auto", "chat", "raw"),
                    help="chat: one user turn in the chat template; raw: a completion prompt as is; "
                         "auto (default): chat when the tokenizer has a template")
    add_config_options(ap)
    ap.add_argument("--check-lossless", action="store_true", help="compare with model.generate(do_sample=False)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (default: text, then JSON)")
    return ap


_DEFAULT = DecodeConfig()


def add_config_options(ap: argparse.ArgumentParser, *, method: bool = True) -> None:
    """The options that set ``DecodeConfig`` settings, ``--preset`` and ``--cost-curve``: the decoding settings every
    CLI of the engine takes alike (the sweep and the bench too; the bench, which runs a list of methods, leaves out
    ``--method``).  Each setting's option is derived from its declaration (``config.SETTINGS``): the option is its
    flat name (``--max-depth``; ``dest`` the flat name), earlier spellings still read (``--depth``)."""
    for setting in SETTINGS.values():
        if setting.shown.cli and (method or setting.name != "method"):
            _add_option(ap, setting)
    if method:
        ap.add_argument("--drafter", default="", metavar="'NAME=VALUE, ...'",
                        help="a single-source method's own settings, by their names (an engine's drafter: the "
                             "engine's own, e.g. 'prompt_lookup_min=2, num_speculative_tokens=8' for vllm-ngram)")
    ap.add_argument("--preset", default="default", choices=tuple(PRESETS),
                    help="named configuration the other options change (paper = the Goose authors' implementation)")
    ap.add_argument("--cost-curve", default=None,
                    help="cost curve for auto / chord: a spec 'past=128;1:5.1,2:5.3,...', a curve JSON file or an "
                         "earlier result JSON (default: this machine's measured curve, cached)")


def _add_option(ap: argparse.ArgumentParser, setting: Setting) -> None:
    """``setting``'s option (``Setting.option``, its aliases too), its default the config's."""
    how, names = setting.shown, (setting.option, *setting.shown.aliases)
    if how.negated:
        ap.add_argument(*names, dest=setting.name, action="store_false", help=how.help or None)
        return
    default = setting.default
    help_text = how.help + (f" (default {','.join(default)})" if isinstance(default, tuple) else "")
    ap.add_argument(*names, dest=setting.name, type=how.parse or type(default), default=default,
                    choices=how.choices, help=help_text or None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def config_from_args(args: argparse.Namespace) -> DecodeConfig:
    """The ``DecodeConfig`` the parsed options make: ``--preset``'s settings, changed by every option whose
    ``dest`` is a flat name and whose value is not the config default (an option left at its default
    keeps the preset's value).  Raises ``ConfigError`` for an unknown preset or a value out of range."""
    options = {k: v for k, v in vars(args).items() if k in FLAT_NAMES}
    preset = PRESETS.get(args.preset, {})
    config = DecodeConfig.preset(args.preset, **{k: v for k, v in options.items()
                                                 if k not in preset or v != _DEFAULT.get(k)})
    return with_drafter(config, getattr(args, "drafter", ""))


def command_line(config: DecodeConfig, *, model: str, prompt_format: str = "auto", cost_curve=None,
                 prompt_file: str = "PROMPT.txt", prompt: str | None = None) -> str:
    """One copyable command (``python -m engine.product.generate ...``) that runs ``config`` again, written from
    ``build_parser``'s own options: the options whose value differs from what leaving them out gives.
    ``prompt`` given: the command carries it (``--prompt``, shell-quoted), so it needs no other file; else it
    reads ``prompt_file``.

    ``cost_curve`` (a ``CostCurve``, the one a GT "auto" / "chord" run read) travels as ``--cost-curve`` so
    the trees are the same anywhere.  A config no command line can express (a field no option sets, or a
    preset field set back to the default) gets a trailing ``# not expressible: field=value`` comment.
    """
    parser = build_parser()
    head = ["--model", model, "--prompt-format", prompt_format,
            *(["--prompt", prompt] if prompt is not None else ["--prompt-file", prompt_file])]
    preset = next((name for name, changes in PRESETS.items() if changes
                   and all(config.get(k) == v for k, v in changes.items())), "default")
    if preset != "default":
        head += ["--preset", preset]
    if cost_curve is not None and config.needs_cost_curve:
        head += ["--cost-curve", cost_curve.spec()]
    omitted = config_from_args(parser.parse_args(head))  # what every option left out gives
    args = list(head)
    for action in parser._actions:  # argparse keeps no public list of its options
        value = config.get(action.dest) if action.dest in FLAT_NAMES else None
        if value is None or value == omitted.get(action.dest):
            continue
        if action.nargs == 0:  # a switch (--no-bypass): present when the config holds its constant
            args += [action.option_strings[0]] if value == action.const else []
        else:
            args += [action.option_strings[0], _option_text(value)]
    if config.method in SOURCES and config.source_config(config.method) != omitted.source_config(config.method):
        args += ["--drafter", drafter_text(config)]  # the method's own settings, by the names the page shows
    command = shlex.join(["python", "-m", "engine.product.generate", *args])
    again = config_from_args(parser.parse_args(args))
    lost = [f"{name}={config.get(name)!r}" for name in FLAT_NAMES if again.get(name) != config.get(name)]
    return command + (f"  # not expressible: {', '.join(lost)}" if lost else "")


def _option_text(value) -> str:
    """A config value as the CLI reads it: tuples comma-joined, floats exact (repr)."""
    if isinstance(value, tuple):
        return ",".join(value)
    return repr(value) if isinstance(value, float) else str(value)


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
    print(f"model: {lm.summary()}", file=sys.stderr)
    prompt_ids = lm.encode_prompt(prompt, chat={"auto": None, "chat": True, "raw": False}[args.prompt_format])
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
    result = {"model": lm.name, "device": lm.device, "dtype": lm.precision, "dtype_reason": lm.dtype_reason,
              "method": args.method, "prompt_tokens": len(prompt_ids),
              "gt_threshold": decoder.config.gt.threshold, "config": decoder.config.to_dict(),
              "cost_curve": decoder.cost_curve.to_dict() if decoder.cost_curve is not None else None,
              "serve": serving_dict(config),
              **summarize(traces).to_dict(), "text": lm.tokenizer.decode(tokens), "token_ids": tokens}
    if args.check_lossless:
        ref = greedy_reference(lm.model, prompt_ids, args.max_new_tokens, lm.eos_token_ids)
        found = attribute(lm.model, prompt_ids, ref, tokens)  # None when the ids are identical
        # fp32 is exact (no tolerance at all); in half precision only a precision tie may part from AR
        result["lossless"] = found is None or (found.kind == "precision tie" and found.dtype != "fp32")
        result["divergence"] = found.to_dict() if found is not None else None
        if found is not None:
            verdict = "" if result["lossless"] else "LOSSLESS VIOLATION: "
            if found.dtype == "fp32":
                verdict += "(fp32 allows no difference) "
            print(verdict + found.sentence(lm.tokenizer.decode), file=sys.stderr)
    if not args.json:
        print(result["text"])
    print(json.dumps(result, indent=None if args.json else 2))
    return 1 if result.get("lossless") is False else 0


if __name__ == "__main__":
    sys.exit(main())
