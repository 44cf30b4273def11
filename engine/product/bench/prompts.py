"""The benchmark's prompts: the prompt sets the project ships (``DATASETS``), read and turned into prompt ids."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from engine import ASSETS
from engine.product.runs.reference import greedy_reference

#: the prompt sets shipped with the project (whole files, each with its LICENSE and SOURCE.md); ``--data DIR``
#: reads another folder of the same layout and formats
DEFAULT_DATA = ASSETS / "datasets"
DATASETS = {  # name -> (file, how to get the prompt text from a record, prompt format)
    "humaneval": ("humaneval/HumanEval.jsonl", lambda r: r["prompt"], "raw"),  # code to complete
    "mbpp": ("mbpp/mbpp.jsonl", lambda r: r["text"], "chat"),  # instructions ("Write a function ...")
    "gsm8k": ("gsm8k/test.jsonl", lambda r: r["question"], "chat"),
    "mt_bench": ("mt_bench/question.jsonl", lambda r: r["turns"][0], "chat"),
    # MT-Bench second turns, the model's own (greedy) first answer in context: where suffix drafting copies
    "mt_bench2": ("mt_bench/question.jsonl", lambda r: r["turns"][:2], "chat"),
}


class BenchError(Exception):
    """Bad benchmark arguments or inputs; the message says what to change."""


def load_prompts(data_dir: Path, dataset: str, limit: int) -> list[str]:
    if dataset not in DATASETS:
        raise BenchError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    rel, get, _ = DATASETS[dataset]
    path = data_dir / rel
    if not path.exists():
        raise BenchError(f"{path} not found (--data takes a folder laid out as assets/datasets, e.g. {rel})")
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()][:limit]
    return [get(json.loads(ln)) for ln in lines]




@torch.no_grad()
def encode(lm, text: str | list[str], prompt_format: str, max_new_tokens: int) -> list[int]:
    """A dataset record's prompt ids.  A list of turns (``mt_bench2``) becomes a chat whose earlier turns are
    answered by the model itself (greedy, ``max_new_tokens``), ending with the last turn."""
    if isinstance(text, str):
        return lm.encode_prompt(text, chat=prompt_format == "chat")
    if not lm.has_chat_template:  # e.g. the demo model: the turns and answers as one raw text
        raw = ""
        for turn in text[:-1]:
            raw += turn + "\n\n"
            raw += lm.tokenizer.decode(greedy_reference(lm.model, lm.encode_prompt(raw, chat=False), max_new_tokens,
                                                         lm.eos_token_ids)) + "\n\n"
        return lm.encode_prompt(raw + text[-1], chat=False)
    messages: list[dict] = []
    for turn in text[:-1]:
        messages.append({"role": "user", "content": turn})
        answer = greedy_reference(lm.model, lm.encode_messages(messages), max_new_tokens, lm.eos_token_ids)
        messages.append({"role": "assistant", "content": lm.tokenizer.decode(answer, skip_special_tokens=True)})
    return lm.encode_messages([*messages, {"role": "user", "content": text[-1]}])


