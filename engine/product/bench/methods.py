"""The benchmark's methods by name: the engine's (with their variants, ``method_config``), transformers' and
llama.cpp's."""
from __future__ import annotations

import json

from engine.decoding.config import FLAT_NAMES, METHODS, PRESETS, DecodeConfig, parse_gt_threshold
from engine.product.bench.llamacpp import METHODS as LLAMACPP_METHODS
from engine.product.bench.prompts import BenchError

HF_METHODS = {"hf-ar": {}, "hf-pld": {"prompt_lookup_num_tokens": 10}, "hf-assisted": {}}
#: Engine method variants: "goose+ptd" = goose with PTD added to its sources; a trailing "@pld>tr>ptd"
#: sets the walk priority (e.g. "goose+ptd@ptd>pld>tr", used by the PTD priority experiment); a trailing
#: "/c=X" sets that method's GT threshold (auto | chord | a number), e.g. "goose/c=0" (the GT A/B); "-paper"
#: starts from a named preset (``config.PRESETS``: "goose-paper", "pld-paper", "iso3-paper"); each trailing
#: ":field=value" sets one DecodeConfig field, the value read as JSON when it parses, else as a string
#: (e.g. "goose:match_occurrence=latest:bypass=false", "goose-paper/c=auto:branch_growth=best-first").
DEFAULT_METHODS = "ar,pld,tr,iso3,iso5,goose,hf-ar,hf-pld"
FP32_AR = "ar-fp32"  # AR on an fp32 copy of the model (``--fp32-ar``): the exact mode's speed, for reference


def parse_methods(text: str, draft_model: str | None) -> list[str]:
    methods = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    for m in methods:
        if m not in HF_METHODS and m not in LLAMACPP_METHODS:
            method_config(m)  # raises BenchError on an unknown method or variant
    if "hf-assisted" in methods and not draft_model:
        raise BenchError("method 'hf-assisted' needs --draft-model (a small model sharing the target's tokenizer)")
    return ["ar"] + [m for m in methods if m != "ar"]  # AR is always measured in the same run


def method_config(name: str) -> dict:
    """``DecodeConfig`` settings (flat names) of an engine method name: 'goose', 'goose+ptd', 'goose+ptd@ptd>pld>tr',
    'goose-paper', 'goose/c=0', 'goose:budget=16', 'vllm-ngram:vllm_prompt_lookup_min=2', ...

    Raises:
        BenchError: unknown method, source or priority.
    """
    head, *assignments = name.split(":")
    variant, _, threshold = head.partition("/c=")
    spec, _, priority = variant.partition("@")
    base, _, preset = spec.rpartition("-")  # 'goose-paper'; a method's own hyphen ('vllm-ngram') is no preset
    spec, preset = (base, preset) if base and preset in PRESETS else (spec, "")
    method, *extra = spec.split("+")
    if method not in METHODS or (preset and preset not in PRESETS):
        raise BenchError(f"unknown method {name!r}; choose from {', '.join(METHODS + tuple(HF_METHODS))} "
                         "(engine methods take +ptd / +pld / +tr, @a>b>c, /c=X, -preset and :field=value variants)")
    fields: dict = {**PRESETS[preset or "default"], "method": method}
    if extra:
        fields["sources"] = tuple(dict.fromkeys((*DecodeConfig().sources, *extra)))
    if priority:
        fields["walk_priority"] = tuple(priority.split(">"))
    for assignment in assignments:
        key, eq, value = assignment.partition("=")
        if not eq or key not in FLAT_NAMES:
            raise BenchError(f"method {name!r}: {assignment!r} is not name=value with a DecodeConfig setting")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        fields[key] = tuple(parsed) if isinstance(parsed, list) else parsed
    try:
        if threshold:
            fields["gt_threshold"] = parse_gt_threshold(threshold)
        DecodeConfig.of(**fields)
    except (TypeError, ValueError) as exc:  # a ":field=value" of the wrong type fails in the checks
        raise BenchError(f"method {name!r}: {exc}") from None
    return fields


