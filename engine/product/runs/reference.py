"""The lossless reference: plain greedy decoding of the same weights on the same kernels.

Where the transformers model's own weights run (every torch path), the reference is transformers' own
``generate(do_sample=False)``.  Where a forward path runs other weights (llama.cpp's kernels on the model's GGUF
file: ``ForwardPath.weights``), ``generate`` on the torch model would be another model: the reference is then AR on
that path, the decoding loop with one one-node tree a cycle (``method="ar"``), which is what the benchmark's AR row
runs there.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.decoding.config import DecodeConfig
from engine.product.runs.decoder import make_decoder


@torch.no_grad()
def greedy_reference(model, prompt_ids: Sequence[int], max_new_tokens: int,
                     eos_token_ids: Sequence[int] = ()) -> list[int]:
    """Token ids of ``model.generate(do_sample=False)`` after the prompt (EOS included when produced)."""
    eos = list(eos_token_ids) or None
    out = model.generate(torch.tensor([list(prompt_ids)], device=model.device), do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos[0] if eos else None)
    return out[0, len(prompt_ids):].tolist()


def path_reference(lm, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Token ids of greedy AR on ``lm``'s own forward path (a ``LoadedModel``): one one-node tree a cycle, stopping
    at ``lm``'s EOS ids (EOS included when produced), as the benchmark's ``ar`` method runs."""
    config = DecodeConfig.of(method="ar", max_new_tokens=max_new_tokens)
    traces = make_decoder(lm, config, lm.eos_token_ids).generate(list(prompt_ids))
    return [t for trace in traces for t in trace.new_tokens]


def lossless_reference(lm, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """The greedy output a run of ``lm`` (a ``LoadedModel``) is held to, token for token: ``generate`` on the
    transformers model where its own weights run (``lm.runs.weights == "transformers"``), else AR on ``lm``'s forward
    path (``path_reference``): like is compared with like."""
    if lm.runs.weights == "transformers":
        return greedy_reference(lm.model, prompt_ids, max_new_tokens, lm.eos_token_ids)
    return path_reference(lm, prompt_ids, max_new_tokens)
