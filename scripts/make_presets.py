"""Copy a few benchmark prompts into assets/presets.json (with attribution) for the app's preset menu.

The running app must not depend on ../shared/data, so the handful of prompts it offers are copied
here once.  Usage: python scripts/make_presets.py [--data ../shared/data]
"""
import argparse
import json
from pathlib import Path

PICKS = [  # (dataset, file, record index, field, label)
    ("humaneval", "HumanEval.jsonl", 0, "prompt", "HumanEval/0 has_close_elements"),
    ("humaneval", "HumanEval.jsonl", 2, "prompt", "HumanEval/2 truncate_number"),
    ("humaneval", "HumanEval.jsonl", 11, "prompt", "HumanEval/11 string_xor"),
    ("mbpp", "mbpp.jsonl", 10, "text", "MBPP/11 remove first and last occurrence"),
    ("gsm8k", "test.jsonl", 0, "question", "GSM8K test #0 (Janet's ducks)"),
    ("mt_bench", "question.jsonl", 40, "turns", "MT-Bench 121 (coding)"),
]
SOURCES = {
    "humaneval": ("https://github.com/openai/human-eval", "MIT, Copyright (c) OpenAI"),
    "mbpp": ("https://github.com/google-research/google-research (mbpp/mbpp.jsonl)", "CC BY 4.0"),
    "gsm8k": ("https://github.com/openai/grade-school-math", "MIT, Copyright (c) 2021 OpenAI"),
    "mt_bench": ("https://github.com/lm-sys/FastChat (fastchat/llm_judge/data/mt_bench)", "Apache-2.0"),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "assets" / "presets.json"))
    args = ap.parse_args()
    presets = []
    for dataset, fname, idx, field, label in PICKS:
        record = json.loads((Path(args.data) / dataset / fname).read_text(encoding="utf-8").splitlines()[idx])
        text = record[field][0] if field == "turns" else record[field]
        url, license_ = SOURCES[dataset]
        presets.append({"label": label, "dataset": dataset, "prompt": text, "source": url, "license": license_})
    Path(args.out).write_text(json.dumps(presets, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(presets)} presets to {args.out}")


if __name__ == "__main__":
    main()
