"""Copy a few benchmark prompts into assets/presets.json (with attribution) for the app's preset menu.

The page offers a handful of prompts from the prompt sets shipped in assets/datasets, copied here once with
their source and license.  Usage: python scripts/make_presets.py [--data DIR]
"""
import argparse
import json
from pathlib import Path

PICKS = [  # (dataset, file, record index, field, label, prompt format: raw completion or chat template)
    # chosen on SmolLM2-135M-Instruct: coherent greedy answers, PLD and TR tokens both accepted
    # GSM8K #0 first: the page starts on it, and on SmolLM2 with the default settings its second cycle
    # already verifies a spine tree of PLD and TR nodes (MBPP/3's first such tree comes at cycle 49)
    ("gsm8k", "test.jsonl", 0, "question", "GSM8K test #0 Janet's ducks (chat)", "chat"),
    ("mbpp", "mbpp.jsonl", 2, "text", "MBPP/3 non-prime numbers (chat)", "chat"),
    ("mt_bench", "question.jsonl", 40, "turns", "MT-Bench 121 coding (chat)", "chat"),
    ("mt_bench", "question.jsonl", 25, "turns", "MT-Bench 106 reasoning (chat)", "chat"),
    ("humaneval", "HumanEval.jsonl", 7, "prompt", "HumanEval/7 filter_by_substring (raw code)", "raw"),
    ("humaneval", "HumanEval.jsonl", 12, "prompt", "HumanEval/12 longest (raw code)", "raw"),
    ("humaneval", "HumanEval.jsonl", 0, "prompt", "HumanEval/0 has_close_elements (raw code)", "raw"),
]
SOURCES = {
    "humaneval": ("https://github.com/openai/human-eval", "MIT, Copyright (c) OpenAI"),
    "mbpp": ("https://github.com/google-research/google-research (mbpp/mbpp.jsonl)", "CC BY 4.0"),
    "gsm8k": ("https://github.com/openai/grade-school-math", "MIT, Copyright (c) 2021 OpenAI"),
    "mt_bench": ("https://github.com/lm-sys/FastChat (fastchat/llm_judge/data/mt_bench)", "Apache-2.0"),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "assets" / "datasets"))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "assets" / "presets.json"))
    args = ap.parse_args()
    presets = []
    for dataset, fname, idx, field, label, prompt_format in PICKS:
        record = json.loads((Path(args.data) / dataset / fname).read_text(encoding="utf-8").splitlines()[idx])
        text = record[field][0] if field == "turns" else record[field]
        url, license_ = SOURCES[dataset]
        presets.append({"label": label, "dataset": dataset, "prompt": text, "format": prompt_format, "source": url,
                        "license": license_})
    Path(args.out).write_text(json.dumps(presets, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(presets)} presets to {args.out}")


if __name__ == "__main__":
    main()
