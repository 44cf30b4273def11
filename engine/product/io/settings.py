"""Every setting as people meet it, declared once by its flat name (``DecodeConfig``'s flat names): its words, its
CLI option and help, the page's range, how a sweep reads its values.  The CLIs' options
(``engine.product.io.options``), the page's ranges (``page.settings.RANGES``) and the sweep's parameters
(``engine.product.runs.sweep.spec.PARAMETERS``) derive from ``SETTINGS``.  A flat name without a declaration is still a
trace key and a bench ``method:name=value`` setting, with no option or control.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.decoding.config import (
    FLAT_NAMES,
    METHODS,
    SOURCES,
    VERIFIERS,
    DecodeConfig,
    parse_gt_threshold,
    parse_names,
)


@dataclass(frozen=True)
class Shown:
    """Where and how a setting shows outside the engine.  Its flat name is its one name everywhere: the CLI option
    (``--max-depth``), the page's control, the trace file's key, the sweep's parameter and the bench's
    ``method:name=value``."""

    words: str  # its name for people, e.g. "node budget B" (messages, the sweep's axis, the page's notes)
    help: str = ""  # the CLI's help line (a tuple default is appended to it)
    page: tuple[float, float] | None = None  # the page's range (the slider's minimum and maximum); None: no number
    sweep: str | None = None  # how a sweep reads its values ("int", "ratio", "threshold", "method", "sources")
    symbol: str = ""  # the paper's symbol (B, r, D, c): a sweep lists these parameters first
    cli: bool = True  # an option of every CLI (generate, bench, sweep)
    parse: Callable[[str], Any] | None = None  # CLI text -> value (default: the default value's type)
    choices: tuple[str, ...] | None = None  # the values the CLI accepts, when a closed list
    aliases: tuple[str, ...] = ()  # earlier option names that still read (command lines written before)
    negated: bool = False  # a switch that turns the setting off (``--no-bypass``), for a boolean that is on


@dataclass(frozen=True)
class Setting:
    """One setting as people meet it: its flat name, its default and how it shows (``Shown``)."""

    name: str  # flat name: the CLI option's dest, the page control's name, the trace key
    default: Any  # ``DecodeConfig()``'s value
    shown: Shown

    @property
    def option(self) -> str:
        """The CLI option: ``--max-depth``, or ``--no-bypass`` for a negated switch."""
        return ("--no-" if self.shown.negated else "--") + self.name.replace("_", "-")


#: How each shown setting shows, by flat name (the reason for each default is beside its config field).
SHOWN: dict[str, Shown] = {
    "method": Shown("method", sweep="method", choices=METHODS),
    "max_new_tokens": Shown("max new tokens", page=(1, 1024)),
    "sources": Shown("draft sources", sweep="sources", parse=parse_names,
                     help=f"draft sources goose / iso(k) mix, comma-separated among {','.join(SOURCES)}"),
    "budget": Shown("node budget B", help="node budget B, root included", page=(1, 128), sweep="int", symbol="B"),
    "spine_ratio": Shown("spine ratio r", help="fixed spine ratio r (default: adaptive)", page=(0.05, 0.95),
                         sweep="ratio", symbol="r", parse=float),
    "max_depth": Shown("max depth D", help="max depth D", page=(1, 16), sweep="int", symbol="D", aliases=("--depth",)),
    "bypass": Shown("bypass", help="never verify PLD matches as a linear chain", negated=True),
    "walk_priority": Shown("walk priority", help="order the walk tries children's sources in", parse=parse_names),
    "gt_threshold": Shown("GT threshold c", page=(0.0, 0.99), sweep="threshold", symbol="c", parse=parse_gt_threshold,
                          help="GT rule: 'auto' (speedup-optimal tree size from the measured cost curve, default), "
                               "'chord' (one c from the curve), or a number c (0 disables)"),
    "gt_rest_after": Shown("GT rest after", parse=int,
                           help="after this many cycles in a row GT priced down to the anchor, branch sources rest "
                                "in all but every such cycle (0: never rest, as on the page)"),
    "temperature": Shown("temperature", help="0 = greedy (default); > 0 = sampling mode", page=(0.0, 2.0)),
    "top_p": Shown("top-p", help="nucleus mass when sampling (1 = off)", page=(0.05, 1.0)),
    "sample_top_k": Shown("top-k", help="keep the k most likely tokens when sampling (0 = off)", page=(0, 100),
                          aliases=("--top-k",)),
    "seed": Shown("seed", help="seed of the sampling generator and of PTD's initial rows"),
    "verifier": Shown("verifier", help="sampling verifier for chains (tree | hsd)", choices=VERIFIERS),
}
assert set(SHOWN) <= set(FLAT_NAMES), f"declared settings that are no flat name: {set(SHOWN) - set(FLAT_NAMES)}"

#: The declared settings (an option, a control, a sweep parameter), by flat name, in ``FLAT_NAMES`` order.
SETTINGS: dict[str, Setting] = {name: Setting(name, DecodeConfig().get(name), SHOWN[name])
                                for name in FLAT_NAMES if name in SHOWN}
