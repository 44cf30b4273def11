"""Issue 74, item 3: a run's cost curve is chosen once, by the model's owner (``CurveOwner.for_run``), over the
process's shared curves held by one object (``CurveStore``); the page's Generate and Race ask it once per run and
hand the answer to every decoder of the run, and whether a visitor's own curve belongs to the model is the owner's
call (``CurveOwner.own``)."""
from __future__ import annotations

import pytest

pytest.importorskip("gradio")

from engine.decoding.config import DecodeConfig  # noqa: E402
from engine.decoding.cost import CostCurve  # noqa: E402
from engine.product.models.cost_cache import CurveOwner, CurveStore, RunCurve, curve_key  # noqa: E402
from engine.product.models.registry import ModelRegistry  # noqa: E402

CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"


def test_the_owner_chooses_what_gt_reads_and_what_the_page_shows(demo_lm, monkeypatch):
    """``for_run``: the visitor's own curve is read and shown whatever the config; else the shared curve is shown,
    and read only where GT's rule reads a curve ("auto", "chord"); ``needed`` False with no own curve asks nothing."""
    shared = CostCurve((1, 128), (5.0, 9.0), key=curve_key(demo_lm.model))
    asked = []
    monkeypatch.setattr(CurveOwner, "shared", lambda owner, say=None: asked.append(owner) or shared)
    owner = demo_lm.curves
    own = CostCurve((1, 128), (5.0, 5.0), key=curve_key(demo_lm.model))
    auto, number = DecodeConfig(), DecodeConfig.of(gt_threshold=0.1)
    assert owner.for_run(None, auto) == RunCurve(shared, shared)
    assert owner.for_run(None, number) == RunCurve(shared, None) and len(asked) == 2
    assert owner.for_run(own, number) == RunCurve(own, own) and owner.for_run(own, number, needed=False).read is own
    assert owner.for_run(None, number, needed=False) == RunCurve(None, None) and len(asked) == 2
    other = CostCurve((1, 128), (5.0, 5.0), key="another model|cpu|fp32|torch")
    assert owner.own(other) is None and owner.own(own) is own and owner.own(None) is None


def test_the_shared_curves_are_one_stores_state(demo_lm, tmp_path):
    """A store holds the curves it read; another store (another process) reads the disk, and an owner asks the store
    it was given."""
    store = CurveStore(tmp_path)
    curve = CostCurve.from_spec("past=128;" + ",".join(f"{n}:{5 + 0.1 * n:.3f}" for n in
                                                       (*range(1, 17), 20, 24, 32, 48, 64, 128)),
                                key=curve_key(demo_lm.model))
    file = store.file(demo_lm.model)
    store.curves[file] = curve
    assert CurveOwner(demo_lm.model, store=store).known() is curve
    assert CurveStore(tmp_path).known(demo_lm.model) is None  # nothing on disk: another process has none


@pytest.fixture
def counted(monkeypatch):
    """Every ask of a run's curve (``CurveOwner.for_run``) and every read of a shared one (``CurveStore.cached``),
    in order."""
    calls = []
    for_run, cached = CurveOwner.for_run, CurveStore.cached
    monkeypatch.setattr(CurveOwner, "for_run", lambda self, *a, **k: calls.append("for_run") or for_run(self, *a, **k))
    monkeypatch.setattr(CurveStore, "cached", lambda self, *a, **k: calls.append("cached") or cached(self, *a, **k))
    return calls


@pytest.mark.parametrize("auto_c", [True, False])
def test_generate_asks_the_owner_once(demo_lm, counted, auto_c):
    """One Generate: one choice, one read of the shared curve (its decoder and AR's beside it are handed the
    choice); GT's curve is the one shown where it reads one ("auto"), none where c is a number."""
    from page.generate import generate
    from page.settings import PageSettings

    settings = PageSettings(prompt=CODE, auto_c=auto_c, gt_threshold=0.1, max_new_tokens=8)
    frames = list(generate(settings, models=ModelRegistry(demo_lm)))
    run = frames[-1]["run"]
    assert counted == ["for_run", "cached"]
    assert run.shown_curve is not None
    assert run.cost_curve == (run.shown_curve if auto_c else None)


def test_a_race_asks_the_owner_once(demo_lm, counted):
    """One Race: one choice and one read of the shared curve for both lanes and the board."""
    from page.race import race
    from page.settings import PageSettings

    frames = list(race(PageSettings(prompt=CODE, max_new_tokens=8), models=ModelRegistry(demo_lm)))
    assert "8 / 8 tokens" in frames[-1]["race_board"]
    assert counted == ["for_run", "cached"]


def test_a_visitors_own_curve_is_chosen_once_and_no_shared_one_read(demo_lm, counted):
    from page.contract import Session
    from page.generate import generate
    from page.settings import PageSettings

    own = CostCurve((1, 128), (5.0, 5.0), key=curve_key(demo_lm.model, demo_lm.forward))
    frames = list(generate(PageSettings(prompt=CODE, max_new_tokens=8), session=Session(curve=own),
                           models=ModelRegistry(demo_lm)))
    assert counted == ["for_run"] and frames[-1]["run"].cost_curve == own.spec() == frames[-1]["run"].shown_curve
