"""The lossless reference: plain greedy decoding with transformers' own ``generate``."""
from __future__ import annotations

from collections.abc import Sequence

import torch


@torch.no_grad()
def greedy_reference(model, prompt_ids: Sequence[int], max_new_tokens: int,
                     eos_token_ids: Sequence[int] = ()) -> list[int]:
    """Token ids of ``model.generate(do_sample=False)`` after the prompt (EOS included when produced)."""
    eos = list(eos_token_ids) or None
    out = model.generate(torch.tensor([list(prompt_ids)], device=model.device), do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos[0] if eos else None)
    return out[0, len(prompt_ids):].tolist()
