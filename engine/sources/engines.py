"""The serving engines' side of the sources: the command that runs a source's drafter in vLLM, SGLang or llama.cpp.

Every source's settings say theirs (``serve()``); ``engine/product/io/deploy.py`` turns a run's method into one.
The engines' own flag names and versions are in each source's module (``vllm_ngram.py``, ``vllm_suffix.py``,
``sglang_ngram.py``, ``llamacpp_ngram.py``); ``scripts/engine_drafters.sh`` builds two engines' drafters for
tests/test_engine_drafters.py to compare them with.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Serve:
    """The serving engine's configuration that runs a drafter: every source's settings say theirs (``serve()``).

    ``flags`` are the engine's own names: vLLM's ``--speculative-config`` JSON keys, SGLang's launch flags without
    ``--``, llama.cpp server's flags without ``--`` (a flag that takes no value maps to None).  ``differs`` is one
    sentence on what the engine's drafter does otherwise than the one run here ("" = it is the engine's drafter).
    """

    engine: str  # "vLLM", "SGLang", "llama.cpp"; "" when no engine ships a like drafter
    flags: dict[str, Any] = field(default_factory=dict)
    differs: str = ""

    @property
    def command(self) -> str:
        """The engine's launch command, the model written MODEL (never a path of this machine)."""
        if self.engine == "vLLM":
            return f"vllm serve MODEL --speculative-config '{json.dumps(self.flags)}'"
        if self.engine == "SGLang":
            return "python -m sglang.launch_server --model-path MODEL " + _flag_words(self.flags)
        if self.engine == "llama.cpp":
            return "llama-server -m MODEL.gguf " + _flag_words(self.flags)
        return ""


def _flag_words(flags: dict[str, Any]) -> str:
    """``{"draft-max": 16, "x": None}`` -> ``--draft-max 16 --x``."""
    return " ".join(f"--{k}" if v is None else f"--{k} {v}" for k, v in flags.items())
