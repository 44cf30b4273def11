"""Race: AR and the chosen method on one device and a shared clock, streamed lane by lane."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator, Iterator, Sequence

from engine.decoding.config import ConfigError
from engine.product.models.loaded import LoadedModel
from engine.product.models.registry import ModelRegistry
from engine.product.runs.decoder import make_decoder
from engine.product.runs.lossless import attribute
from engine.product.runs.race import Lane, Pacer, Race
from engine.product.runs.run import SPEEDUP_WORDS, ArTiming, Speedup, disagreement
from page.contract import Session
from page.frames import ar_key, named, paused, problem
from page.policy import race_predicted_s, race_wall_s
from page.settings import PageSettings
from page.setup import set_up
from viz.explain import race_board, race_estimate, race_overrun
from viz.frame_text import METHOD_LABELS

RACE_OUT = ("race_ar", "race_spec", "race_board", "ar_clock")
RACE_EVERY_S = 0.2  # the board redraws at most this often in real time: its clock is engine time, which drawing
# does not enter (a browser on the same CPU still slows both lanes alike)


def race(settings: PageSettings, race_seconds: float = 0.0, session: Session = Session(), *,
         models: ModelRegistry) -> Iterator[dict]:
    """AR vs the chosen method on one device and a shared clock (``engine.product.runs.race``): stream both texts and
    the board (``RACE_OUT``): the speedup in large type, measured as every speedup on the page is (``Speedup.of``:
    the decode phase, engine time, with its 95 % margin), and each lane's progress (tokens / max new tokens).

    ``race_seconds`` plays the race over about that many seconds of wall time (``engine.product.runs.race.Pacer``:
    the race's engine clock shown at a fixed scale, so the lanes keep their proportions; 0 = real time); the board
    counts engine time only.  The lanes take turns on one device, so a race lasts at least both lanes' engine time:
    the board says from the start how long it is expected to take on screen (``page.policy.race_wall_s``, from AR's
    timing or the cost curve), and at the end when it ran past that, and why.  Stop (``session.control``) ends both
    runs and keeps their outputs so far.  When a greedy race ends with two different outputs, the board says where
    they part and both logits there (``race_verdict``).  AR's lane, when it finished, is this visitor's AR timing
    for the prompt (``ar_clock``), so a later Generate of the same prompt shows its speedup without timing AR again;
    the race's speedup is kept beside it, and a later figure that differs beyond both margins says why.
    """
    try:
        setup = set_up(settings, session, models)
    except ConfigError as exc:
        yield problem(str(exc), "race_board")
        return
    control, lm, ids, config = setup.control, setup.lm, setup.ids, setup.config
    stop = lambda: bool(control.get("stop"))  # noqa: E731
    curve, read = setup.curve()  # the race's one choice of cost curve: the board's and AR's, and what GT reads
    spec = make_decoder(lm, config, lm.eos_token_ids, cost_curve=read, memory=session.memory)
    ar = make_decoder(lm, config.with_(method="ar"), lm.eos_token_ids, cost_curve=curve)
    contest = Race({"AR": ar.generate(ids, stop),
                    METHOD_LABELS.get(config.method, config.method): spec.generate(ids, stop)})
    key = ar_key(models, lm, ids, config)
    then = session.measured(key)
    ar_s = race_predicted_s(session.ar_timing(key), curve, config.max_new_tokens, len(ids))
    plan = _Plan(race_seconds, race_wall_s(race_seconds, ar_s, then[1].value if then is not None else None), ar_s)
    yield {"race_board": race_board(contest.lanes, config.max_new_tokens, None, plan.words())}
    try:
        on_screen = yield from _play(contest, Pacer(float(race_seconds or 0), ar_s), lm, config.max_new_tokens, plan,
                                     control)
    except Exception as exc:  # noqa: BLE001 - keep serving; the user sees why the race stopped
        yield problem(f"The race stopped: {exc}. Both outputs so far stay on screen.", "race_board")
        return
    if on_screen is not None:  # stopped while the screen played what the engines had done: that is kept
        yield _race_frame(on_screen, lm, config.max_new_tokens, stopped=True)
        return
    base, other = contest.lanes
    late = race_overrun(time.perf_counter() - plan.started, plan.expected_s, base.elapsed_s + other.elapsed_s)
    note, clock = _kept(contest, session, key, then) if base.finished and not stop() else ("", None)
    if base.finished and other.finished and not stop() and base.tokens != other.tokens:
        yield _race_frame(contest.lanes, lm, config.max_new_tokens, False, "The outputs differ: finding where …")
        note = " ".join(x for x in (note, race_verdict(lm, ids, base.tokens, other.tokens, config.sampling)) if x)
    final = _race_frame(contest.lanes, lm, config.max_new_tokens, stop(), note, late)
    yield {**final, "ar_clock": clock} if clock is not None else final


class _Plan:
    """A race's length on screen: asked (``race_seconds``), expected (``expected_s``, ``race_wall_s``), AR's lane's
    predicted engine time (``ar_s``) and when it began (``started``, ``time.perf_counter``)."""

    def __init__(self, race_seconds, expected_s: float, ar_s: float) -> None:
        self.race_seconds, self.expected_s, self.ar_s = float(race_seconds or 0), expected_s, ar_s
        self.started = time.perf_counter()

    def words(self) -> str:
        """The estimate on the board while the race runs (``viz.explain.race_estimate``)."""
        return race_estimate(self.expected_s, self.ar_s, self.race_seconds)


def _kept(contest: Race, session: Session, key, then) -> tuple[str, dict]:
    """After a race whose AR lane finished: the sentence where its speedup and the last one measured on the prompt
    (``then``) differ beyond their margins (``disagreement``), and the visitor's new ``ar_clock`` (AR's lane as
    their AR timing, the race's speedup kept beside it)."""
    base, other = contest.lanes
    timing = ArTiming.of(base.traces, "race")
    clock = session.with_ar_timing(key, timing)
    measured = Speedup.of(other.traces, timing)
    if measured.value is None:
        return "", clock
    return (disagreement(measured, "this race", *named(then)),
            session.with_measured(key, "the Race", measured, clock))


def _play(contest: Race, pacer: Pacer, lm: LoadedModel, max_new_tokens: int, plan: _Plan,
          control: dict) -> Generator[dict, None, list[Lane] | None]:
    """``race``'s frames while both lanes run, paced to about ``plan.race_seconds`` of wall time (``pacer``; 0 =
    real time), the estimate on the board: a frame at most every 0.05 s when paced, else every ``RACE_EVERY_S``;
    none at the end.

    The engines never pause for the pace: a forward that starts after an idle pause runs cold (its threads asleep,
    its caches another lane's), and a race slowed to 20 s read each lane's tok/s at 0.7 of Generate's (SmolLM2 on
    llama.cpp's kernels, 80 ms pauses: 62 vs 87 tok/s; on the page, beside the browser, 18 vs 30-55).  So the lanes
    run ahead of the screen: each frame is made when the race's clock reaches its time and shown when its scaled
    wall time comes (``Pacer.wait_s``); the frames the engines ran ahead of are shown after they end, at their
    times.  Stop during that playback ends it at the frame on screen (the engines had already finished): returns
    the lanes on screen then (None: the race played to its end, or the engines saw the stop themselves)."""
    started = time.perf_counter()
    every = 0.05 if plan.race_seconds else RACE_EVERY_S
    ahead: deque[tuple[float, list[Lane]]] = deque()  # (wall time to show it, the lanes then): made before its time
    next_frame, shown = 0.0, [x.snapshot() for x in contest.lanes]
    for lane in contest.steps():
        if lane is contest.lanes[0]:
            pacer.refine(lane, max_new_tokens)
        if contest.over:
            break
        now = time.perf_counter() - started
        show_at = now + pacer.wait_s(contest.clock_s, now)
        if show_at >= next_frame:
            ahead.append((show_at, [x.snapshot() for x in contest.lanes]))
            next_frame = show_at + every
        due = None
        while ahead and ahead[0][0] <= time.perf_counter() - started:
            due = ahead.popleft()[1]  # only the latest frame due is drawn
        if due is not None:
            shown = due
            yield _race_frame(due, lm, max_new_tokens, stopped=False, late=plan.words())
    if not ahead:
        return None
    for show_at, lanes in ahead:  # the engines are done; the frames they ran ahead of, at their times
        paused(show_at - (time.perf_counter() - started), control)
        if control.get("stop"):
            return shown
        shown = lanes
        yield _race_frame(lanes, lm, max_new_tokens, stopped=False, late=plan.words())
    return None


def race_verdict(lm: LoadedModel, ids: list[int], ar_tokens: list[int], spec_tokens: list[int],
                 sampling: bool = False) -> str:
    """Where the race's two outputs part, for the board: ``engine.product.runs.lossless.attribute`` reads both tokens'
    logits off AR's own one-token step there (a precision tie in half precision, else a bug); "" when they agree.
    Sampled outputs are two draws from the same distribution, so they may differ anywhere: said so, nothing
    attributed."""
    if list(ar_tokens) == list(spec_tokens):
        return ""
    if sampling:
        return "Sampling: the two outputs are different draws from the same distribution (lossless in distribution)."
    found = attribute(lm.model, ids, list(ar_tokens), list(spec_tokens), path=lm.forward)  # AR lane's steps
    if found is None:
        return ""
    words = found.sentence(lm.tokenizer.decode)
    return f"{words[:1].upper()}{words[1:]}."


def _race_frame(lanes: Sequence[Lane], lm: LoadedModel, max_new_tokens: int, stopped: bool, verdict: str = "",
                late: str = "") -> dict:
    """Both texts and the board of ``race`` (``viz.explain.race_board``) for ``lanes`` (AR's first): the speedup
    measured as every speedup on the page is (``Speedup.of``: decode phase, engine time, with its margin); ``late``:
    that the race ran past its estimate, and why."""
    status = ""
    if stopped:
        status = "■ stopped: both outputs as of the same engine time."
    elif all(lane.done for lane in lanes):
        same = lanes[0].tokens == lanes[1].tokens
        status = (f"Both done ✓ — the speedup is the method's tokens/s over AR's, {SPEEDUP_WORDS}, as Generate "
                  "measures it" + (", for the same tokens." if same else "; the outputs part: see below."))
    ar, spec = lanes
    measured = Speedup.of(spec.traces, ArTiming.of(ar.traces, "race")) if len(ar.traces) > 1 else None
    return {"race_ar": lm.tokenizer.decode(ar.tokens), "race_spec": lm.tokenizer.decode(spec.tokens),
            "race_board": race_board(lanes, max_new_tokens, measured, " ".join(x for x in (status, late) if x),
                                     verdict)}
