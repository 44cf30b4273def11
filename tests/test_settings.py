"""Each setting is a config field (its default and reason) and one declaration of how it shows
(``engine.product.io.settings.SHOWN``): the CLI options, the page's ranges, the sweep's parameters and the trace keys
derive from them, under one name; earlier spellings still read."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from engine.decoding.config import FLAT_NAMES, DecodeConfig
from engine.product.io.options import command_line, config_from_args, generate_parser
from engine.product.io.settings import SETTINGS
from engine.product.runs.sweep.spec import PARAMETERS, SweepSpec
from page.settings import RANGES, PageSettings

ROOT = Path(__file__).resolve().parents[1]


def test_one_name_everywhere():
    options = {a.dest: a.option_strings[0] for a in generate_parser()._actions if a.dest in FLAT_NAMES}
    assert options["max_depth"] == "--max-depth" and options["sample_top_k"] == "--sample-top-k"
    assert all(option in (f"--{name.replace('_', '-')}", f"--no-{name}") for name, option in options.items())
    assert set(RANGES) <= {f.name for f in PageSettings.__dataclass_fields__.values()} and set(RANGES) <= set(SETTINGS)
    assert set(PARAMETERS) <= set(SETTINGS) and list(PARAMETERS)[:4] == ["budget", "spine_ratio", "max_depth",
                                                                         "gt_threshold"]
    assert set(SETTINGS) <= set(DecodeConfig().to_dict())  # every setting is a trace key


def test_old_command_lines_and_sweep_names_still_read():
    old = config_from_args(generate_parser().parse_args(["--prompt", "x", "--depth", "4", "--top-k", "5"]))
    new = config_from_args(generate_parser().parse_args(["--prompt", "x", "--max-depth", "4", "--sample-top-k", "5"]))
    assert old == new and (old.tree.max_depth, old.sampler.top_k) == (4, 5)
    assert "--max-depth 4 --sample-top-k 5" in command_line(new, model="demo", prompt="x")
    assert SweepSpec.parse("depth", "2,3").parameter == "max_depth"


def test_a_new_setting_is_a_field_and_one_declaration(tmp_path):
    """In a throwaway copy of the engine, one config field and one ``Shown`` line become a CLI option, a page range, a
    sweep parameter and a trace key (the page's slider is one more line in page/layout.py, built from ``RANGES``)."""
    for package in ("engine", "page"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "assets" / "datasets", tmp_path / "assets" / "datasets")
    config = tmp_path / "engine" / "decoding" / "config.py"
    text = config.read_text(encoding="utf-8")
    anchor = "    max_spine: int = 20"
    assert anchor in text
    config.write_text(text.replace(anchor, "    new_knob: int = 2\n" + anchor, 1), encoding="utf-8")
    settings = tmp_path / "engine" / "product" / "io" / "settings.py"
    text = settings.read_text(encoding="utf-8")
    anchor = '    "seed": Shown('
    assert anchor in text
    knob = '    "new_knob": Shown("new knob K", help="a knob", page=(1, 9), sweep="int", symbol="K"),\n'
    settings.write_text(text.replace(anchor, knob + anchor, 1), encoding="utf-8")
    check = textwrap.dedent("""
        from engine.decoding.config import DecodeConfig
        from engine.product.io.options import config_from_args
        from engine.product.io.options import generate_parser
        from page.settings import RANGES
        from engine.product.runs.sweep.spec import PARAMETERS, SweepSpec
        config = config_from_args(generate_parser().parse_args(["--prompt", "x", "--new-knob", "5"]))
        assert config.tree.new_knob == 5 and config.to_dict()["new_knob"] == 5
        assert DecodeConfig.from_dict({"budget": 8}).tree.new_knob == 2  # a trace written before it still reads
        assert RANGES["new_knob"] == (1, 9, "new knob K")
        assert PARAMETERS["new_knob"].symbol == "K"
        assert [c.tree.new_knob for c in SweepSpec.parse("new_knob", "3,4").configs(DecodeConfig())] == [3, 4]
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
