"""Tree figure and charts built from synthetic cycle traces (no model needed)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import replace

from engine.core.tree import DraftTree, GhostNode, Source
from engine.decoding.trace import CycleTrace
from viz.charts import cycle_series, speed_figure
from viz.tree_figure import tree_figure
from viz.tree_layout import node, tidy_layout, tree_graph, visible_token

TEXT = {0: "def", 1: " f", 2: "(", 3: "x", 4: "\n", 5: ")", 6: "y", 9: ":"}


def make_trace(index=1, elapsed=0.01) -> CycleTrace:
    # root -> PLD 1 -> PLD 2 -> PLD 3 ; PLD 2 -> TR 5 ; root -> TR 4 -> TR 6 ; ghost TR 9 under node 1
    tree = DraftTree(tokens=(0, 1, 2, 3, 4, 5, 6), parents=(None, 0, 1, 2, 0, 2, 4),
                     sources=(Source.ROOT, *(Source("pld"),) * 3, *(Source("tr"),) * 3),
                     scores=(1, .5, .5, .5, .3, .2, .4), est_accept=(1, .5, .25, .125, .3, .05, .12))
    return CycleTrace(index=index, mode="tree", tree=tree, ghosts=(GhostNode(1, 9, Source("tr"), 0.01, 0.005),),
                      greedy=(1, 2, 5, 0, 0, 9, 0), accepted=(1, 2, 5), bonus=9, new_tokens=(1, 2, 5, 9),
                      spine_ratio=0.3, p_s_ema=0.4, timings_ms={"forward": 5.0, "total": 6.0}, elapsed_s=elapsed,
                      total_tokens=4, finished=False)


def test_path_category_and_sources():
    t = make_trace()
    assert t.path_category == "spine continuation"
    assert t.accepted_sources == (Source("pld"), Source("pld"), Source("tr"))


def test_layout_is_layered_and_uncrossed():
    g = tree_graph(make_trace())
    pos = tidy_layout(g)
    assert all(pos[v][0] == node(g, v).depth for v in g)  # nothing folded: the column is the depth
    # children keep their parent's order: for every pair of siblings' subtrees, rows do not interleave
    for v in g:
        kids = sorted(g.successors(v), key=lambda c: pos[c][1])
        spans = []
        for c in kids:
            import networkx as nx
            rows = [pos[d][1] for d in nx.descendants(g, c) | {c}]
            spans.append((min(rows), max(rows)))
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))


def test_figure_has_all_sources_accepted_path_ghosts_and_hover():
    """Each node is drawn once, in its source's trace and colour, with a hover that says what the walk made of it."""
    fig = tree_figure(make_trace(), TEXT.get)
    names = {tr.name for tr in fig.data}
    assert {"PLD spine", "TR branch", "accepted path", "bonus token"} <= names
    assert "PTD perturbation" not in names and "vLLM ngram" not in names  # the legend names the sources drawn
    hovers = " ".join(h for tr in fig.data if tr.hovertext for h in tr.hovertext)
    assert "↵" in hovers and "ghost" not in hovers
    by_token = {h.split("</b>")[0][3:]: h for tr in fig.data if tr.hovertext for h in tr.hovertext}
    # a rejected node's hover names what the model wanted at its place: the target's token at its PARENT
    # (TR node 4 hangs off the anchor, where the target wanted greedy[0] = 1 = ' f'), not the token after it
    assert "status: rejected: the model wanted ␣f here" in by_token["↵"]
    # node 6 hangs off the rejected node 4: the walk never compared it; the ghost was never verified
    assert "status: not reached: its parent was rejected" in by_token["y"] and "wanted" not in by_token["y"]
    ghost = next(h for tr in fig.data if tr.hovertext for h in tr.hovertext if "GT" in h)
    assert ghost.endswith("status: pruned by GT, never verified") and "wanted" not in ghost
    assert "the model wanted" not in by_token["("] and "status: accepted" in by_token["("]
    # one labelled trace per kind of node, in the source's colour, with the nodes of that kind (the ghost with TR's)
    labels = {tr.name: tr for tr in fig.data if tr.mode == "markers+text"}
    assert {name: (tr.marker.color, [t for t, x in zip(tr.text, tr.x) if x is not None])
            for name, tr in labels.items()} == {
        "anchor": ("#4b5563", ["def"]), "PLD spine": ("#0072B2", ["␣f", "(", "x"]),
        "TR branch": ("#E69F00", ["↵", ")", "y", ":"]), "folded nodes (+N: rejected, or GT ghosts)": ("#4b5563", []),
        "bonus token": ("#D55E00", [":"])}
    assert labels["bonus token"].marker.symbol == ("star",)
    assert {tr.textfont.size for tr in labels.values()} == {16}  # legible from the back row
    legend = {tr.name for tr in fig.data if tr.showlegend is not False}
    assert {"accepted path", "rejected (faded)", "ghost: pruned by GT, never verified", "bonus token"} <= legend
    assert fig.layout.uirevision == "draft-tree"
    no_ghosts = tree_figure(make_trace(), TEXT.get, show_ghosts=False)
    assert "pruned by GT" not in " ".join(h for tr in no_ghosts.data if tr.hovertext for h in tr.hovertext)


def test_visible_token_escapes_and_shows_whitespace():
    assert visible_token(" <b>\t\n") == "␣&lt;b&gt;→↵"
    assert visible_token('("x")') == '("x")'  # quotes stay as they are: plotly shows &quot; literally


def test_charts_running_means():
    """The speed chart plots tokens/s and τ per cycle and their running means, each series under its own name."""
    traces = [make_trace(i, elapsed=0.01 * (i + 1)) for i in range(3)]
    s = cycle_series(traces)
    assert s["tau"] == [4.0, 4.0, 4.0] and s["mean_tau"] == [4.0, 4.0, 4.0]
    assert abs(s["mean_tok_per_s"][-1] - 12 / 0.03) < 1e-6
    fig = speed_figure(traces)  # per cycle 4 tokens in 6 ms (667 tok/s); running mean 12 tokens in 0.03 s (400)
    assert [(tr.name, tr.type, tuple(tr.y)) for tr in fig.data] == [
        ("tok/s this cycle", "scatter", (4 / 0.006,) * 3), ("tok/s running mean", "scatter", (12 / 0.03,) * 3),
        ("τ this cycle", "bar", (4.0,) * 3), ("τ running mean", "scatter", (4.0,) * 3)]
    assert [fig.data[0].marker.color, fig.data[1].line.color, fig.data[2].marker.color, fig.data[3].line.color] == [
        "#93c5fd", "#1d4ed8", "#fcd34d", "#b45309"]
    assert [a.text for a in fig.layout.annotations] == ["tokens/s", "τ (tokens per forward)"]


def test_explain_cycle_tells_the_spine_continuation():
    from viz.explain import explain_cycle

    text = explain_cycle(make_trace(), TEXT.get)
    assert text.startswith("tree: spine matched 2 tokens and broke at 'x' (the target wanted ')')")
    assert "TR branch ')' was accepted" in text and "bonus ':' → 4 tokens from one forward of 7 nodes" in text


def test_confidence_shows_in_the_sentence_and_the_title():
    from dataclasses import replace

    from viz.explain import explain_cycle

    plain = make_trace()
    assert "confident" not in explain_cycle(plain, TEXT.get)  # a trace without the fields (schema 1)
    assert "budget" not in tree_figure(plain, TEXT.get).layout.title.text
    extended = replace(plain, confidence=0.9, match_tokens=2, chain_tokens=34, budget=84)
    text = explain_cycle(extended, TEXT.get)
    assert text.startswith("tree: confident match (0.90): chain extended 2 → 34 tokens, 3 laid as the spine, budget "
                           "84;")  # the title's words (issue 56: "chain 20 → 90 tokens" beside "spine extended to 2")
    title = tree_figure(extended, TEXT.get).layout.title  # the shape on a second, smaller line
    assert title.subtitle.text == "confidence 0.90, chain extended 2 → 34 tokens, 3 laid as the spine, budget 84"
    assert "budget" not in title.text
    short = replace(plain, confidence=0.3, match_tokens=4, chain_tokens=4, budget=72)
    assert "confident" not in explain_cycle(short, TEXT.get)
    assert (tree_figure(short, TEXT.get).layout.title.subtitle.text
            == "confidence 0.30, match 4 tokens, 3 laid as the spine, budget 72")


def test_cycle_segments_label_tokens_by_source():
    from viz.explain import cycle_segments

    assert cycle_segments(make_trace(), TEXT.get) == [(" f", "PLD"), ("(", "PLD"), (")", "TR"), (":", "bonus")]


def wide_trace(width: int = 127) -> CycleTrace:
    """B = 128 at c = 0: a 5-token accepted spine and 122 rejected TR nodes, many of them siblings."""
    parents, sources = [None, 0, 1, 2, 3, 4], [Source.ROOT] + [Source("pld")] * 5
    while len(parents) < width + 1:
        k = len(parents)
        parents.append(k - 6 if k % 3 == 0 and k > 10 else k % 6)
        sources.append(Source("tr"))
    n = len(parents)
    tree = DraftTree(tokens=tuple(i % 9 for i in range(n)), parents=tuple(parents), sources=tuple(sources),
                     scores=(1.0,) * n, est_accept=(0.5,) * n)
    return CycleTrace(index=3, mode="tree", tree=tree, ghosts=(), greedy=(1,) * n, accepted=(1, 2, 3, 4, 5), bonus=6,
                      new_tokens=(1, 2, 3, 4, 5, 6), spine_ratio=0.3, p_s_ema=0.4, timings_ms={"total": 6.0},
                      elapsed_s=0.1, total_tokens=6, finished=False)


def overlapping(boxes):
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]]


def test_no_overlap_at_b128_and_folded_counts_add_up():
    from viz.tree_figure import label_boxes
    from viz.tree_layout import FIG_HEIGHT_PX

    trace = wide_trace()
    fig = tree_figure(trace, lambda i: f"tok{i}")
    boxes = label_boxes(fig)
    texts = [t for tr in fig.data if tr.mode == "markers+text" for t in tr.text]
    assert len(boxes) == len(texts) >= 8 and not overlapping(boxes)  # every drawn label checked
    assert fig.layout.height == FIG_HEIGHT_PX  # fits the first screen
    folded = sum(int(t[1:]) for t in texts if t[0] in "+⋯")
    assert folded + sum(t[0] not in "+⋯" for t in texts) == len(trace.tree) + 1  # every node, + bonus
    # every node drawn: the figure grows instead
    full = tree_figure(trace, lambda i: f"tok{i}", show_all=True)
    assert not overlapping(label_boxes(full)) and full.layout.height > FIG_HEIGHT_PX


def test_a_long_chain_folds_its_middle():
    """A chain deeper than the screen keeps its ends and folds its middle into one "⋯N" that counts every token."""
    from viz.tree_figure import label_boxes
    from viz.tree_layout import MAX_COLUMNS

    n = 41
    tree = DraftTree(tokens=tuple(range(n)), parents=(None, *range(n - 1)),
                     sources=(Source.ROOT, *(Source("pld"),) * 40), scores=(1.0,) * n, est_accept=(0.9,) * n)
    trace = CycleTrace(index=1, mode="bypass", tree=tree, ghosts=(), greedy=tuple(range(1, n + 1)),
                       accepted=tuple(range(1, n)), bonus=n, new_tokens=tuple(range(1, n + 1)), spine_ratio=None,
                       p_s_ema=0.9, timings_ms={"total": 6.0}, elapsed_s=0.1, total_tokens=n, finished=False)
    fig = tree_figure(trace, lambda i: f"t{i}")
    xs = [x for tr in fig.data if tr.mode == "markers+text" for x in tr.x if x is not None]
    assert max(xs) + 1 <= MAX_COLUMNS and not overlapping(label_boxes(fig))
    texts = [t for tr in fig.data if tr.mode == "markers+text" for t in tr.text]
    assert {"t0", "t1", "t2", "t39", "t40", "t41"} <= set(texts)  # anchor, both ends of the chain, bonus
    pld = next(tr for tr in fig.data if tr.name == "PLD spine")
    (fold, hover), = [(t, h) for t, h in zip(pld.text, pld.hovertext) if t.startswith("⋯")]  # one fold: the middle
    singles = [t for t in pld.text if not t.startswith("⋯")]
    assert int(fold[1:]) + len(singles) == 40  # every chain token, once
    assert hover.startswith(f"<b>{fold[1:]} PLD spine tokens in a row, accepted</b>")


def test_step_through_stages():
    """Step-through draws each stage's nodes and says, per stage, how many guesses, nodes and tokens it saw."""
    from viz.lesson import stage_sentence, stages_of
    from viz.tree_figure import STAGES

    trace = make_trace()
    assert stages_of(trace) == ["pld", "tr", "scored", "walk", "bonus"]
    drawn = {}
    for stage in STAGES:
        fig = tree_figure(trace, TEXT.get, stage=stage)
        drawn[stage] = Counter()  # nodes drawn per name (a source's legend mark is a trace of its own, no node)
        for tr in fig.data:
            drawn[stage][tr.name] += len([x for x in tr.x if x is not None])
    said = {stage: stage_sentence(trace, stage, TEXT.get) for stage in stages_of(trace)}
    assert said["pld"].startswith("**1a · drafts: PLD spine** — 3 guesses — the spine: ")
    assert said["tr"].startswith("**1b · drafts: TR branch** — 3 guesses: ")  # the ghost was never drafted here
    assert said["scored"].startswith("**2 · one forward scores them all** — one forward over all 7 nodes")
    assert "3 draft tokens accepted" in said["walk"] and said["walk"].startswith("**3 · the walk accepts")
    assert said["bonus"].startswith("**4 · the bonus token** — the model's token after the last accepted one, ':', ")
    assert "4 tokens committed from one forward" in said["bonus"]
    assert drawn["pld"]["PLD spine"] == 3 and drawn["pld"]["TR branch"] == 0 and drawn["pld"]["bonus token"] == 0
    assert drawn["tr"]["TR branch"] == 4  # 3 TR nodes and the TR ghost
    assert drawn["walk"]["bonus token"] == 0 and drawn["bonus"]["bonus token"] == 1
    scored = tree_figure(trace, TEXT.get, stage="scored")
    marks = "".join(t for tr in scored.data if tr.mode == "markers+text" for t in tr.text)
    assert "✓" in marks and "✗" in marks


def test_explain_cycle_says_why_gt_auto_chose_the_size():
    from dataclasses import replace

    from viz.explain import explain_cycle

    sized = replace(make_trace(), gt_nodes=7, gt_candidates=31, gt_expected=1.9, gt_cost_ms=5.3)
    said = explain_cycle(sized, TEXT.get)  # counted on the tree drawn (7 nodes, 1 ghost), not the size choice's 31
    assert "GT kept 7 nodes, pruned 1 (the ghost): 2.9 tokens expected for 5.3 ms on the cost curve" in said
    pruned = replace(make_trace(), mode="ar", tree=DraftTree.root_only(0), ghosts=(), accepted=(), new_tokens=(9,),
                     gt_nodes=1, gt_candidates=12, gt_expected=0.0, gt_cost_ms=2.5)
    text = explain_cycle(pruned, TEXT.get)
    assert text.startswith("GT pruned every draft: none was expected") and "plain AR step" in text
    assert "GT" not in explain_cycle(make_trace(), TEXT.get)  # a fixed c, or a trace without the fields


def broken_spine_trace(length: int = 59) -> CycleTrace:
    """A spine of ``length`` PLD tokens that broke at its first token, a TR branch off every spine node, and a TR
    child of the anchor that was accepted (issue 19: the whole spine used to fold into a grey "+59")."""
    parents, sources = [None, 0], [Source.ROOT, Source("tr")]  # node 1: the accepted TR child of the anchor
    spine = []
    for k in range(length):
        parents.append(0 if k == 0 else spine[-1])
        sources.append(Source("pld"))
        spine.append(len(parents) - 1)
    for s in spine:  # one rejected TR branch (two tokens deep) off every spine node
        parents.append(s)
        sources.append(Source("tr"))
        parents.append(len(parents) - 1)
        sources.append(Source("tr"))
    n = len(parents)
    tree = DraftTree(tokens=tuple(i % 50 for i in range(n)), parents=tuple(parents), sources=tuple(sources),
                     scores=(1.0,) * n, est_accept=(0.5,) * n)
    return CycleTrace(index=7, mode="tree", tree=tree, ghosts=(), greedy=(1,) * n, accepted=(1,), bonus=7,
                      new_tokens=(1, 7), spine_ratio=0.9, p_s_ema=0.4, timings_ms={"total": 6.0}, elapsed_s=0.1,
                      total_tokens=2, finished=False)


def test_a_spine_that_broke_at_once_stays_blue():
    """Spine tokens are never folded into "+N": its first and last tokens show in the spine's colour, its middle
    as a "⋯N" square of the same colour (with the branches hanging off it), and the tree still fits."""
    from viz.tree_figure import label_boxes
    from viz.tree_layout import FIG_HEIGHT_PX, MAX_COLUMNS

    trace = broken_spine_trace()
    fig = tree_figure(trace, lambda i: f"t{i}")
    pld = next(tr for tr in fig.data if tr.name == "PLD spine")
    assert pld.marker.color == "#0072B2"  # blue: PLD's colour, folded runs included
    shown = [t for t, x in zip(pld.text, pld.x) if x is not None]
    assert len(shown) >= 3 and any(t.startswith("⋯") for t in shown), shown  # first, ⋯N, last
    assert [sym == "square" for sym in pld.marker.symbol] == [t.startswith("⋯") for t in shown]  # a run: a square
    assert sum(int(t[1:]) if t.startswith("⋯") else 1 for t in shown) == 59  # every spine token, in the spine
    spine = trace.tree.spine
    texts = {t for t in shown}
    assert f"t{spine[0] % 50}" in texts and f"t{spine[-1] % 50}" in texts
    groups = [h for tr in fig.data if tr.name.startswith("folded") for h in (tr.hovertext or ())]
    assert all("PLD" not in h for h in groups)  # no spine token inside a "+N"
    folded = next(h for h, t in zip(pld.hovertext, pld.text) if t.startswith("⋯"))
    assert "PLD spine tokens in a row, rejected" in folded and "side nodes hanging off them" in folded
    xs = [x for tr in fig.data if tr.mode == "markers+text" for x in tr.x if x is not None]
    assert max(xs) + 1 <= MAX_COLUMNS and fig.layout.height == FIG_HEIGHT_PX and not overlapping(label_boxes(fig))
    count = sum(int(t[1:]) if t[0] in "+⋯" else 1 for tr in fig.data if tr.mode == "markers+text" for t in tr.text)
    runs = [h for h, t in zip(pld.hovertext, pld.text) if t.startswith("⋯")]
    sides = sum(int(re.search(r"\(and (\d+) side nodes? hanging off them\)", h)[1]) for h in runs)
    assert count + sides == len(trace.tree) + 1  # every node drawn once or counted once in a run (+ the bonus)


def test_edges_start_at_their_parent():
    """Every edge leaves its parent right after the parent's own label (not at a column-wide x), so a child of a
    short label is visibly attached to it; it then runs level at the parent's row."""
    from viz.tree_layout import CHAR_PX, MARKER_PX

    trace = make_trace()
    short = {0: "d", 1: "␣x", 2: "(", 3: "x", 4: "a very long label", 5: ")", 6: "y", 9: ":"}
    fig = tree_figure(trace, lambda i: short.get(i, "?"))
    nodes = {(x, y): t for tr in fig.data if tr.mode == "markers+text" for x, y, t in zip(tr.x, tr.y, tr.text)
             if x is not None}
    span = fig.layout.xaxis.range[1] - fig.layout.xaxis.range[0]
    px_per_col = 860 / span
    starts = []
    for tr in fig.data:
        if tr.mode != "lines" or not tr.name.endswith("edges"):
            continue
        pts = list(zip(tr.x, tr.y))
        for k in range(0, len(pts) - 3, 4):  # (own label end, column end, child, None)
            (x0, y0), (_, y1) = pts[k], pts[k + 1]
            assert y0 == y1  # level at the parent's row
            parent = next((x, y) for (x, y) in nodes if y == y0 and x < x0 and x0 - x < 1)
            label = nodes[parent]
            expected = parent[0] + (MARKER_PX / 2 + 4 + len(label) * CHAR_PX) / px_per_col
            assert abs(x0 - expected) < 1e-9, (label, x0, expected)
            starts.append(label)
    assert "␣x" in starts  # the short label's child hangs from it


def test_title_counts_and_says_when_the_path_was_cut():
    from dataclasses import replace

    one = replace(make_trace(), accepted=(), new_tokens=(9,))
    assert " · 1 token (" in tree_figure(one, TEXT.get).layout.title.text
    cut = replace(make_trace(), new_tokens=(1,), finished=True)  # 3 accepted + bonus, max new tokens kept 1
    title = tree_figure(cut, TEXT.get).layout.title.text
    assert " · 1 token (" in title and "cut at 1 of 4 by EOS / max new tokens" in title


# -- colour-blind-safe palette: Machado, Oliveira & Fernandes (2009), severity 1, in linear RGB; CIE76 ΔE in Lab --
CVD = {"normal": ((1, 0, 0), (0, 1, 0), (0, 0, 1)),
       "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216),
                      (-0.003882, -0.048116, 1.051998)),
       "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413),
                        (-0.011820, 0.042940, 0.968881)),
       "tritanopia": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602),
                      (0.004733, 0.691367, 0.303900))}
MIN_DELTA_E = 15  # CIE76: ~2.3 is a just-noticeable difference; 15 tells two swatches apart at a glance


def _lab(hex_colour: str, vision: str) -> tuple[float, float, float]:
    rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    lin = [min(1.0, max(0.0, sum(m * c for m, c in zip(row, lin)))) for row in CVD[vision]]
    xyz = [sum(m * c for m, c in zip(row, lin)) / w for row, w in zip(
        ((0.4124, 0.3576, 0.1805), (0.2126, 0.7152, 0.0722), (0.0193, 0.1192, 0.9505)), (0.95047, 1.0, 1.08883))]
    f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def _closest_pair(colours: dict[str, str]) -> tuple[float, str, str, str]:
    import itertools
    import math

    return min((math.dist(_lab(colours[a], v), _lab(colours[b], v)), a, b, v)
               for v in CVD for a, b in itertools.combinations(colours, 2))


def test_palette_every_mark_distinct_for_colour_blind_eyes():
    """Issue 19: "bonus" and "Suffix" were hard to tell apart, and the violet path and the blue spine were one
    colour to a deuteranope (ΔE 1.7).  Every source, the bonus and the path mark in the tree, and every label of the
    coloured output, stay ``MIN_DELTA_E`` apart in normal vision and under each of the three dichromacies."""
    from engine.sources import REGISTRY
    from viz.frame_text import COLOR_MAP, SHOWN
    from viz.tree_figure import ACCEPT_COLOR, BONUS_COLOR

    marks = {**{i.name: i.colour for i in REGISTRY}, "bonus": BONUS_COLOR, "path": ACCEPT_COLOR}
    assert _closest_pair(marks)[0] >= MIN_DELTA_E, _closest_pair(marks)
    output = {k: v for k, v in COLOR_MAP.items()}
    assert set(output) >= {i.short for i in REGISTRY} | {"bonus", "AR", SHOWN}
    assert _closest_pair(output)[0] >= MIN_DELTA_E, _closest_pair(output)
    assert _closest_pair({"path": "#7c3aed", "pld": "#2563eb"})[0] < 5  # the check catches the old pair


def test_each_source_has_one_colour_in_the_tree_and_the_text():
    """Issue 47, finding 6: SGLang's nodes were brown and its tokens pink-red, llama.cpp's khaki and mint, and
    vLLM suffix's tokens nearer PLD's blue than its own violet.  Each source's token tint is now nearest (CIE76,
    normal vision) its own node colour of all the sources' node colours."""
    import math

    from engine.sources import REGISTRY

    colours = {i.name: i.colour for i in REGISTRY}
    for source in REGISTRY:
        near = sorted((math.dist(_lab(source.tint, "normal"), _lab(c, "normal")), name) for name, c in colours.items())
        assert near[0][1] == source.name, (source.name, near[:2])


def test_step_through_numbers_the_stages_the_cycle_has():
    """A cycle with no PLD drafts used to start at "1b"; its one source stage is "1", two are "1a", "1b"."""
    from viz.lesson import stage_sentence, stages_of

    tr_only = DraftTree(tokens=(0, 4, 6), parents=(None, 0, 1), sources=(Source.ROOT, Source("tr"), Source("tr")),
                        scores=(1, .3, .4), est_accept=(1, .3, .12))
    from dataclasses import replace

    trace = replace(make_trace(), tree=tr_only, ghosts=(), greedy=(4, 6, 0), accepted=(1, 2), new_tokens=(4, 6, 9))
    assert stages_of(trace)[0] == "tr"
    assert stage_sentence(trace, "tr", TEXT.get).startswith("**1 · drafts: TR branch**")
    both = make_trace()
    assert stage_sentence(both, "pld", TEXT.get).startswith("**1a · drafts: PLD spine**")
    assert stage_sentence(both, "tr", TEXT.get).startswith("**1b · drafts: TR branch**")


def test_a_cycle_title_says_what_none_accepted_means():
    """Issue 47, finding 9: the title read "1 token (none)" where no draft token was accepted; it now says what
    happened (the bonus token only; an AR step; the prefill's token)."""
    from dataclasses import replace

    from viz.tree_title import default_title

    tree_cycle = replace(make_trace(), accepted=(), new_tokens=(9,))
    assert "1 token (no draft accepted: the bonus token only)" in default_title(tree_cycle)
    assert "(one AR step: no drafts)" in default_title(replace(tree_cycle, mode="ar", ghosts=()))
    # issue 56, finding 3: an AR step whose drafts GT priced out draws them as ghosts; the title says so
    ghost = GhostNode(0, 5, Source("tr"), 0.2, 0.2)
    assert "(one AR step: GT kept none of 2 drafts)" in default_title(replace(tree_cycle, mode="ar",
                                                                             ghosts=(ghost, ghost)))
    assert "(the prefill's own next token)" in default_title(replace(tree_cycle, mode="prefill"))
    assert "(none" not in default_title(tree_cycle)


def test_the_theory_panel_compares_like_with_like():
    """Issue 47, finding 8: the panel set the whole run's τ against the bound for one cycle's shape, then said
    correlated acceptances make the measured τ exceed it while the table showed it below.  Now the bound is the
    mean over the run's tree cycles' shapes, beside what those cycles committed, and the sentence follows the
    numbers."""
    from types import SimpleNamespace

    from engine.core.theory import spine_yield_bound, tree_shape
    from viz.explain import theory_panel

    trace = make_trace()  # 3 accepted + the bonus: 4 tokens
    for p_t, side in ((0.4, "at or above"), (0.9, "is below")):
        summary = SimpleNamespace(cycles=2, forwards=3, p_s=0.5, p_t=p_t, tau=2.5)
        text = theory_panel(summary, trace, 16, 6, [trace, trace])
        expected = spine_yield_bound(0.5, p_t, *tree_shape(trace.tree), 6)
        assert "| measured τ over the 2 tree cycles (accepted + bonus per forward) | **4.00** |" in text
        assert f"| Eq. 1 bound, mean over the same 2 cycles' shapes | **{expected:.2f}** |" in text
        assert side in text.split("\n")[-1] and (expected <= 4.0) == (side == "at or above")
        assert "| cycle 1: its tokens (accepted + bonus) / Eq. 1 bound for its shape" in text


def test_a_count_of_pruned_candidates_says_where_the_drawing_has_them():
    """Issue 47, finding 6: "(the 44 ghosts)" while most sat in "+N" folds.  ``ghost_marks`` counts them as the
    figure draws them, and the words follow."""
    from viz.explain import ghost_words
    from viz.tree_figure import GhostMarks, ghost_marks

    trace = make_trace()  # one ghost, nothing to fold
    assert ghost_marks(trace) == GhostMarks(1, 0, 0) and ghost_marks(trace, show_ghosts=False) == GhostMarks(0, 0, 1)
    assert ghost_words(1, ghost_marks(trace)) == " (the ghost)"
    assert ghost_words(44, GhostMarks(12, 32, 0)) == " (12 drawn as ghosts, 32 in the +N folds)"
    assert ghost_words(4, GhostMarks(0, 4, 0)) == " (all in the +N folds)"
    assert ghost_words(35, GhostMarks(1, 34, 0)) == " (1 drawn as a ghost, 34 in the +N folds)"  # issue 47's QA
    assert ghost_words(2, GhostMarks(1, 1, 0)) == " (1 drawn as a ghost, 1 in a +N fold)"
    assert ghost_words(4, GhostMarks(0, 0, 4)) == " (not drawn: ghosts are switched off)"
    assert ghost_words(0, GhostMarks(0, 0, 0)) == ""


def ghostly_trace() -> CycleTrace:
    """``wide_trace`` with GT ghosts under its rejected nodes (node names "g<k>" beside ints), folded with them."""
    trace = wide_trace(60)
    ghosts = tuple(GhostNode(p, 40 + k, Source("tr"), 0.1, 0.05) for k, p in enumerate(range(6, 60, 2)))
    return replace(trace, ghosts=ghosts)


def test_a_folded_tree_draws_the_same_in_every_process():
    """Folds list their nodes in the graph's order, not a set's: node names mix ints and strings ("g3"), whose hashes
    differ from process to process, so two processes under other hash seeds must draw the same figure."""
    code = ("import sys; sys.path[:0] = ['tests', '.']; from test_viz import ghostly_trace; "
            "from viz.tree_figure import tree_figure; print(tree_figure(ghostly_trace(), lambda i: f't{i}').to_json())")
    drawn = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")}
    assert len(drawn) == 1


def test_a_cycle_cut_by_max_new_tokens_draws_the_cut(demo_lm):
    """Issue 73: the accepted path is drawn up to the tokens the cycle committed; the nodes past the cut say so and
    the bonus token, never committed, is not drawn."""
    from engine.decoding.config import DecodeConfig
    from engine.decoding.cost import CostCurve
    from engine.product.runs.decoder import make_decoder
    from viz.tree_figure import tree_figure

    flat = CostCurve.from_spec("past=128;1:3,2:3.1,4:3.2,8:3.4,16:3.8,32:4.5,64:6,128:9")
    ids = demo_lm.encode_prompt("def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n", chat=False)
    cut = None
    for n in range(2, 24):
        last = list(make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=n), demo_lm.eos_token_ids,
                                 cost_curve=flat).generate(ids))[-1]
        if len(last.new_tokens) < len(last.accepted):
            cut = last
            break
    assert cut is not None, "inconclusive: no cycle was cut inside its accepted path"
    fig = tree_figure(cut, lambda i: demo_lm.tokenizer.decode([i]))
    names = [t.name for t in fig.data if t.x and t.x[0] is not None]
    assert "bonus token" not in names
    hovers = [h for t in fig.data for h in (t.hovertext or [])]
    assert sum("past the cut" in h for h in hovers) == len(cut.accepted) - len(cut.new_tokens)


def test_on_a_phone_the_title_and_legend_fit_the_first_view():
    """Issue 73: on a 390 px phone the tree (880 px wide, scrolling sideways in a ~326 px box) had its one-line
    title and horizontal legend cut in the first view; ``fit_to_screen`` wraps them to the box and grows the
    figure by the lines it gained.  A wide (or unknown) window's figure is left as it was."""
    from viz.tree_figure import SUBTITLE_CHAR_PX, TITLE_CHAR_PX, fit_to_screen

    trace = replace(make_trace(), confidence=0.9, match_tokens=2, chain_tokens=34, budget=84)
    wide = tree_figure(trace, TEXT.get)
    assert fit_to_screen(tree_figure(trace, TEXT.get), 1280).to_dict() == wide.to_dict()
    assert fit_to_screen(tree_figure(trace, TEXT.get), 0).to_dict() == wide.to_dict()
    phone = fit_to_screen(tree_figure(trace, TEXT.get), 390)
    title, box = phone.layout.title, 390 - 64
    lines = title.text.split("<br>")
    assert len(lines) > 1 and all(len(line) * TITLE_CHAR_PX <= box for line in lines), lines
    assert " ".join(lines) == wide.layout.title.text  # the same words
    assert all(len(line) * SUBTITLE_CHAR_PX <= box for line in title.subtitle.text.split("<br>"))
    assert phone.layout.legend.orientation == "v"
    entries = sum(t.showlegend is not False for t in phone.data)
    assert phone.layout.margin.b >= 22 * entries and phone.layout.height - wide.layout.height == (
        phone.layout.margin.t - wide.layout.margin.t) + (phone.layout.margin.b - wide.layout.margin.b)
    assert phone.data == wide.data  # the tree itself untouched


def test_the_cost_curves_error_bars_are_its_rounds_interquartile_range_and_never_below_zero():
    """A browser walk-through: after a re-measure on a busy machine the whiskers reached -5 ms (± the whole
    interquartile range about the median).  Now a bar is as wide as the range, centred on the median, cut at 0 ms."""
    import pytest

    from engine.decoding.cost import CostCurve
    from viz.charts import cost_figure

    curve = CostCurve((1, 2, 4), (4.0, 5.0, 6.0), spread=(0.5, 3.0, 0.1))
    error = cost_figure(curve).data[0].error_y
    assert list(error.array) == pytest.approx([1.0, 7.5, 0.3])  # half the range above the median ...
    assert list(error.arrayminus) == pytest.approx([1.0, 5.0, 0.3]) and not error.symmetric  # ... and below, to 0


def test_a_race_lane_shows_its_prefill_apart_from_the_decode_phase_the_speedup_reads():
    """A browser walk-through: lanes read "2401 ms engine time · 77 tok/s" (AR) and "2225 ms engine time · 73 tok/s"
    (the method) beside "0.94×": the totals held AR's colder prefill (its lane runs first), the speedup only the
    decode phase.  Each lane now shows its first token's engine time apart from the time after it."""
    from engine.product.runs.race import Lane
    from viz.explain import race_board

    ar = Lane("AR", tokens=[1] * 128, elapsed_s=2.401, prefill_s=0.759, first_tokens=1, done=True, finished=True)
    goose = Lane("Goose", tokens=[1] * 128, elapsed_s=2.225, prefill_s=0.470, first_tokens=1, done=True,
                 finished=True)
    board = race_board([ar, goose], 128)
    assert "engine time: first token 759 ms, then 1642 ms, 77 tok/s (decode phase)" in board
    assert "engine time: first token 470 ms, then 1755 ms, 72 tok/s (decode phase)" in board
