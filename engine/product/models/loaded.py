"""A model as the engine serves it (``LoadedModel``): the transformers model and tokenizer, the precision and forward
path chosen for this machine and why, and a public name.  ``loading.load_model`` makes one.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.core import compat
from engine.core.forward import EagerPath, ForwardPath
from engine.product.models import precision
from engine.product.models.cost_cache import CurveOwner
from engine.product.models.model_source import ModelSource
from engine.product.models.named import source_gguf
from engine.product.models.what_runs import WhatRuns


@dataclass(frozen=True)
class LoadedModel:
    """A model as the engine serves it: the transformers model and tokenizer, the precision and forward path chosen
    for this machine and why, and a public name (never a machine path).  Made by ``load_model`` (its path then set
    by ``with_forward``); frozen, so one load is shared safely by every visitor of a page.  ``forward`` is the path
    its generations run on, ``for_context(cells)`` the model as a generation of that length runs it.
    """

    model: object  # transformers PreTrainedModel, eval mode
    tokenizer: object  # transformers tokenizer
    name: str  # public id: named model, hub id, or a local model's file / folder name (never a path)
    device: str  # 'cpu', 'cuda', or 'auto (device_map)'
    dtype: torch.dtype
    title: str = ""  # human name for headers, e.g. "SmolLM2-135M-Instruct" (default: ``name``)
    dtype_reason: str = ""  # why this dtype, e.g. "bf16: verifies 16 rows 1.6× faster than fp32 here" (auto)
    auto_dtype: bool = False  # the dtype was chosen by ``dtype="auto"`` (engine/product/models/precision.py)
    param_count: int = 0  # counted at load, before bf16 linears were packed (their weights are no parameters then)
    forward_path: ForwardPath | None = None  # how trees run (engine/core/forward/); None: the eager path
    forward_reason: str = ""  # why this path, e.g. "static: an AR step and a 4-node tree in 8% less time ..." (auto)
    source: ModelSource | None = None  # where it loaded from (private: a path is never shown)

    @property
    def forward(self) -> ForwardPath:
        """The model's forward path, shared by its generations (``forward_choice.choose``; eager by default)."""
        return self.forward_path if self.forward_path is not None else EagerPath(self.model)

    def for_context(self, cells: int) -> LoadedModel:
        """This model as a generation of ``cells`` cells (prompt + max new tokens) runs it: on the path its forward
        path gives that length (``ForwardPath.at``: e.g. llama.cpp's attention without flash attention over a long
        context, where the forward choice measured it cheaper), its reason said; ``self`` where the path is the same.
        A run's record, its cost curve and its AR reference all read the model this returns (every entry point
        calls it once the prompt's length is known)."""
        here = self.forward
        path = here.at(cells)
        if path is here:
            return self
        return replace(self, forward_path=path, forward_reason=f"{path.name} for this run's {cells:,} cells "
                                                                 f"({here.longer.reason})")

    def gguf(self) -> Path | None:
        """The ``.gguf`` file the model came from (the llamacpp path runs it), or None (``named.source_gguf``)."""
        return source_gguf(self.source.fetch, self.source.path) if self.source is not None else None

    curves = property(lambda self: CurveOwner(self.model, self.forward))  # the one owner of its cost curve

    @property
    def runs(self) -> WhatRuns:
        """What runs this model's forwards: weight type, forward path, whose weights (``what_runs.WhatRuns``); the
        record every entry point shows (on llama.cpp's path the file's type, e.g. "Q4_1", never the torch dtype)."""
        return WhatRuns.of(self.precision, self.forward)

    @property
    def params(self) -> int:
        """Number of parameters (tied embeddings counted once)."""
        return self.param_count or sum(p.numel() for p in self.model.parameters())

    def summary(self) -> str:
        """The command line's model line: ``describe()``, why this precision (where it runs) and which path."""
        return (self.describe() + (f" — {self.dtype_reason}" if self.dtype_reason and not self.forward.describe() else
                                   "")
                + (f"; forward path {self.forward_reason}" if self.forward_reason else ""))

    def describe(self) -> str:
        """Header line, e.g. "SmolLM2-135M-Instruct (135M, fp32, CPU)" ("Q4_1 · llama.cpp kernels" for fp32 there)."""
        n = self.params
        size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e7 else f"{n / 1e6:.1f}M"
        dtype = self.forward.describe() or self.precision
        device = "CPU" if self.device == "cpu" else self.device
        return f"{self.title or self.name} ({size}, {dtype}, {device})"

    @property
    def precision(self) -> str:
        """'fp32', 'bf16', 'fp16' or 'q4' (``dtype`` is bf16 then: 4-bit weights, bf16 activations)."""
        return precision.precision_name(self.model)

    has_chat_template = property(lambda self: bool(getattr(self.tokenizer, "chat_template", None)))

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids from the generation config (int or list), else the tokenizer's."""
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        eos = self.tokenizer.eos_token_id if eos is None else eos
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)

    @property
    def max_context(self) -> int | None:
        """Longest sequence (prompt + new tokens) the model's config allows, or None if unknown."""
        return getattr(self.model.config.get_text_config(), "max_position_embeddings", None)

    def context_problem(self, prompt_tokens: int, max_new_tokens: int) -> str | None:
        """A sentence with the remedy when prompt + new tokens pass the model's context or sliding attention window
        (``compat.PositionLimits.problem``, which the decoder also refuses), else None."""
        problem = compat.PositionLimits.of(self.model).problem(prompt_tokens, max_new_tokens)
        return f"{problem[0].upper()}{problem[1:]}." if problem else None

    @torch.no_grad()
    def warm_up(self) -> None:
        """One small forward, so the first user request does not pay for lazy initialisation."""
        self.model(input_ids=torch.tensor([self.encode_prompt("warm up")], device=self.model.device))

    def encode_prompt(self, text: str, chat: bool | None = None) -> list[int]:
        """Token ids of a user prompt.

        Args:
            text: the prompt.
            chat: True = wrap it as one user turn in the tokenizer's chat template (ignored when the
                tokenizer has none); False = raw completion prompt; None = chat when a template exists.
        """
        if (chat is None or chat) and self.has_chat_template:
            return self.encode_messages([{"role": "user", "content": text}])
        return self.tokenizer(text, add_special_tokens=True).input_ids

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """Token ids of a chat (``[{"role": ..., "content": ...}, ...]``) through the tokenizer's chat template,
        ready for the assistant's next turn.  Raises ValueError when the tokenizer has no chat template."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 return_dict=False)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
