"""Each setting is declared once, beside its config field (``config.Shown``): the CLI options, the page's ranges, the
sweep's parameters and the trace keys derive from it, under one name; earlier spellings still read."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from engine.decoding.config import FLAT_NAMES, SETTINGS, DecodeConfig
from engine.product.generate import build_parser, command_line, config_from_args
from engine.product.page_settings import RANGES, PageSettings
from engine.product.sweep_runs import PARAMETERS, SweepSpec

ROOT = Path(__file__).resolve().parents[1]


def test_one_name_everywhere():
    options = {a.dest: a.option_strings[0] for a in build_parser()._actions if a.dest in FLAT_NAMES}
    assert options["max_depth"] == "--max-depth" and options["sample_top_k"] == "--sample-top-k"
    assert all(option in (f"--{name.replace('_', '-')}", f"--no-{name}") for name, option in options.items())
    assert set(RANGES) <= {f.name for f in PageSettings.__dataclass_fields__.values()} and set(RANGES) <= set(SETTINGS)
    assert set(PARAMETERS) <= set(SETTINGS) and list(PARAMETERS)[:4] == ["budget", "spine_ratio", "max_depth",
                                                                         "gt_threshold"]
    assert set(SETTINGS) <= set(DecodeConfig().to_dict())  # every setting is a trace key


def test_old_command_lines_and_sweep_names_still_read():
    old = config_from_args(build_parser().parse_args(["--prompt", "x", "--depth", "4", "--top-k", "5"]))
    new = config_from_args(build_parser().parse_args(["--prompt", "x", "--max-depth", "4", "--sample-top-k", "5"]))
    assert old == new and (old.tree.max_depth, old.sampler.top_k) == (4, 5)
    assert "--max-depth 4 --sample-top-k 5" in command_line(new, model="demo", prompt="x")
    assert SweepSpec.parse("depth", "2,3").parameter == "max_depth"


def test_a_new_setting_is_one_declaration(tmp_path):
    """In a throwaway copy of the engine, one field with ``shown(...)`` becomes a CLI option, a page range, a sweep
    parameter and a trace key (the page's slider is one more line in page/layout.py, built from ``RANGES``)."""
    shutil.copytree(ROOT / "engine", tmp_path / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "assets" / "datasets", tmp_path / "assets" / "datasets")
    config = tmp_path / "engine" / "decoding" / "config.py"
    text = config.read_text(encoding="utf-8")
    anchor = "    max_spine: int = 20"
    assert anchor in text
    knob = ('    new_knob: int = field(default=2, metadata=shown(\n'
            '        "new knob K", help="a knob", page=(1, 9), sweep="int", symbol="K"))\n')
    config.write_text(text.replace(anchor, knob + anchor, 1), encoding="utf-8")
    check = textwrap.dedent("""
        from engine.decoding.config import DecodeConfig
        from engine.product.generate import build_parser, config_from_args
        from engine.product.page_settings import RANGES
        from engine.product.sweep_runs import PARAMETERS, SweepSpec
        config = config_from_args(build_parser().parse_args(["--prompt", "x", "--new-knob", "5"]))
        assert config.tree.new_knob == 5 and config.to_dict()["new_knob"] == 5
        assert DecodeConfig.from_dict({"budget": 8}).tree.new_knob == 2  # a trace written before it still reads
        assert RANGES["new_knob"] == (1, 9, "new knob K")
        assert PARAMETERS["new_knob"].symbol == "K"
        assert [c.tree.new_knob for c in SweepSpec.parse("new_knob", "3,4").configs(DecodeConfig())] == [3, 4]
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
