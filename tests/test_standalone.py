"""The repository stands alone: a copy of its files, with nothing beside it, benchmarks and passes a lossless test.

Users, a Space and anyone's CI have only the clone, so the prompt sets ship in ``assets/datasets`` and no file of
the project may name a folder outside it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = ("../shared", "shared/data", "shared/papers", "parents[2]")  # ways a file has named a folder beside the repo
#: each dataset the bench reads: (file under assets/datasets, records in the shipped file)
SHIPPED = {"humaneval/HumanEval.jsonl": 164, "mbpp/mbpp.jsonl": 974, "gsm8k/test.jsonl": 1319,
           "mt_bench/question.jsonl": 80}


def project_files() -> list[Path]:
    """The files a clone holds: git's tracked and not-ignored files (or, outside a git checkout, the tree
    without caches)."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                                capture_output=True, check=True).stdout.decode().split("\0")
        return [ROOT / name for name in listed if name and (ROOT / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "__pycache__", ".pytest_cache", "results", ".gradio"}
        return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def test_no_file_names_a_folder_outside_the_repo():
    offenders = []
    for path in project_files():
        if path.suffix not in {".py", ".md", ".toml", ".txt", ".json", ".cfg", ".yml", ".yaml", ""}:
            continue
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        offenders += [f"{path.relative_to(ROOT)}: {needle}" for needle in OUTSIDE if needle in text]
    assert not offenders, offenders


def test_prompt_sets_ship_whole_with_their_licenses():
    data = ROOT / "assets" / "datasets"
    for rel, records in SHIPPED.items():
        lines = [ln for ln in (data / rel).read_text(encoding="utf-8").splitlines() if ln.strip()]
        assert len(lines) == records, rel
        folder = (data / rel).parent
        assert (folder / "LICENSE").stat().st_size > 0 and (folder / "SOURCE.md").stat().st_size > 0, folder


@pytest.fixture(scope="module")
def lone_copy(tmp_path_factory) -> Path:
    """The project's files copied to an empty folder: no ``shared`` or any other folder beside them."""
    copy = tmp_path_factory.mktemp("alone") / "goose-lens"
    for path in project_files():
        target = copy / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    assert sorted(p.name for p in copy.parent.iterdir()) == ["goose-lens"]
    return copy


def _run(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"GOOSE_LENS_DATA", "PYTHONPATH"}}
    return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.full  # a copy of the repository and a subprocess that imports torch and gradio anew
def test_bench_runs_from_a_lone_copy(lone_copy, tmp_path):
    done = _run(lone_copy, "-m", "cli.bench", "--model", "demo", "--limit", "2", "--max-new-tokens", "16",
                "--methods", "ar,goose", "--out", str(tmp_path / "bench"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "bench" / "results.md").read_text().count("goose") >= 4  # one row per dataset


@pytest.mark.full  # a second pytest in the copy
def test_lossless_test_passes_from_a_lone_copy(lone_copy):
    done = _run(lone_copy, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "tests/test_lossless.py::test_demo_model_matches_greedy[default]",
                "tests/test_lossless.py::test_demo_model_matches_greedy[method-pld]")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout
