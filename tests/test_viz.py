"""Tree figure and charts built from synthetic cycle traces (no model needed)."""
from __future__ import annotations

from engine.trace import CycleTrace
from engine.tree import DraftTree, GhostNode, Source
from viz.charts import cycle_series, speed_figure
from viz.tree_figure import tidy_layout, tree_figure, tree_graph, visible_token

TEXT = {0: "def", 1: " f", 2: "(", 3: "x", 4: "\n", 5: ")", 6: "y", 9: ":"}


def make_trace(index=1, elapsed=0.01) -> CycleTrace:
    # root -> PLD 1 -> PLD 2 -> PLD 3 ; PLD 2 -> TR 5 ; root -> TR 4 -> TR 6 ; ghost TR 9 under node 1
    tree = DraftTree(tokens=(0, 1, 2, 3, 4, 5, 6), parents=(None, 0, 1, 2, 0, 2, 4),
                     sources=(Source.ROOT, Source.PLD, Source.PLD, Source.PLD, Source.TR, Source.TR, Source.TR),
                     scores=(1, .5, .5, .5, .3, .2, .4), est_accept=(1, .5, .25, .125, .3, .05, .12))
    return CycleTrace(index=index, mode="tree", tree=tree, ghosts=(GhostNode(1, 9, Source.TR, 0.01, 0.005),),
                      greedy=(1, 2, 5, 0, 0, 9, 0), accepted=(1, 2, 5), bonus=9, new_tokens=(1, 2, 5, 9),
                      spine_ratio=0.3, p_s_ema=0.4, timings_ms={"forward": 5.0, "total": 6.0}, elapsed_s=elapsed,
                      total_tokens=4, finished=False)


def test_path_category_and_sources():
    t = make_trace()
    assert t.path_category == "spine continuation"
    assert t.accepted_sources == (Source.PLD, Source.PLD, Source.TR)


def test_layout_is_layered_and_uncrossed():
    g = tree_graph(make_trace())
    pos = tidy_layout(g)
    assert all(pos[v][0] == g.nodes[v]["depth"] for v in g)  # nothing folded: the column is the depth
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
    fig = tree_figure(make_trace(), TEXT.get)
    names = {tr.name for tr in fig.data}
    assert {"PLD spine", "TR branch", "PTD perturbation", "accepted path", "bonus token"} <= names
    hovers = " ".join(h for tr in fig.data if tr.hovertext for h in tr.hovertext)
    assert "↵" in hovers and "the model wanted here" in hovers and "ghost" in hovers
    # a rejected node's hover names what the model wanted at its place: the target's token at its PARENT
    # (TR node 4 hangs off the anchor, where the target wanted greedy[0] = 1 = ' f'), not the token after it
    node4 = next(h for tr in fig.data if tr.hovertext for h in tr.hovertext if h.startswith("<b>↵</b>"))
    assert "status: rejected" in node4 and "the model wanted here: ␣f" in node4
    labels = [tr for tr in fig.data if tr.mode == "markers+text"]
    assert labels and all(tr.textfont.size >= 16 for tr in labels)  # legible from the back row
    legend = {tr.name for tr in fig.data if tr.showlegend is not False}
    assert {"accepted path", "rejected (faded)", "ghost: pruned by GT, never verified", "bonus token"} <= legend
    assert fig.layout.uirevision == "draft-tree"
    no_ghosts = tree_figure(make_trace(), TEXT.get, show_ghosts=False)
    assert "ghost" not in " ".join(h for tr in no_ghosts.data if tr.hovertext for h in tr.hovertext)


def test_visible_token_escapes_and_shows_whitespace():
    assert visible_token(" <b>\t\n") == "␣&lt;b&gt;→↵"
    assert visible_token('("x")') == '("x")'  # quotes stay as they are: plotly shows &quot; literally


def test_charts_running_means():
    traces = [make_trace(i, elapsed=0.01 * (i + 1)) for i in range(3)]
    s = cycle_series(traces)
    assert s["tau"] == [4.0, 4.0, 4.0] and s["mean_tau"] == [4.0, 4.0, 4.0]
    assert abs(s["mean_tok_per_s"][-1] - 12 / 0.03) < 1e-6
    assert len(speed_figure(traces).data) == 4


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
    assert text.startswith("tree: confident match (0.90): spine extended to 3 tokens (of a 34-token chain), budget 84;")
    title = tree_figure(extended, TEXT.get).layout.title.text
    assert title.endswith("· confidence 0.90, chain 2 → 34 tokens, budget 84")
    short = replace(plain, confidence=0.3, match_tokens=4, chain_tokens=4, budget=72)
    assert "confident" not in explain_cycle(short, TEXT.get)
    assert tree_figure(short, TEXT.get).layout.title.text.endswith("· confidence 0.30, match 4 tokens, budget 72")


def test_cycle_segments_label_tokens_by_source():
    from viz.explain import cycle_segments

    assert cycle_segments(make_trace(), TEXT.get) == [(" f", "PLD"), ("(", "PLD"), (")", "TR"), (":", "bonus")]


def wide_trace(width: int = 127) -> CycleTrace:
    """B = 128 at c = 0: a 5-token accepted spine and 122 rejected TR nodes, many of them siblings."""
    parents, sources = [None, 0, 1, 2, 3, 4], [Source.ROOT] + [Source.PLD] * 5
    while len(parents) < width + 1:
        k = len(parents)
        parents.append(k - 6 if k % 3 == 0 and k > 10 else k % 6)
        sources.append(Source.TR)
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
    from viz.tree_figure import FIG_HEIGHT_PX, label_boxes

    trace = wide_trace()
    fig = tree_figure(trace, lambda i: f"tok{i}")
    boxes = label_boxes(fig)
    assert len(boxes) >= 8 and not overlapping(boxes)
    assert fig.layout.height == FIG_HEIGHT_PX  # fits the first screen
    texts = [t for tr in fig.data if tr.mode == "markers+text" for t in tr.text]
    folded = sum(int(t[1:]) for t in texts if t[0] in "+⋯")
    assert folded + sum(t[0] not in "+⋯" for t in texts) == len(trace.tree) + 1  # every node, + bonus
    # every node drawn: the figure grows instead
    full = tree_figure(trace, lambda i: f"tok{i}", show_all=True)
    assert not overlapping(label_boxes(full)) and full.layout.height > FIG_HEIGHT_PX


def test_a_long_chain_folds_its_middle():
    from viz.tree_figure import MAX_COLUMNS, label_boxes

    n = 41
    tree = DraftTree(tokens=tuple(range(n)), parents=(None, *range(n - 1)), sources=(Source.ROOT,) + (Source.PLD,) * 40,
                     scores=(1.0,) * n, est_accept=(0.9,) * n)
    trace = CycleTrace(index=1, mode="bypass", tree=tree, ghosts=(), greedy=tuple(range(1, n + 1)),
                       accepted=tuple(range(1, n)), bonus=n, new_tokens=tuple(range(1, n + 1)), spine_ratio=None,
                       p_s_ema=0.9, timings_ms={"total": 6.0}, elapsed_s=0.1, total_tokens=n, finished=False)
    fig = tree_figure(trace, lambda i: f"t{i}")
    xs = [x for tr in fig.data if tr.mode == "markers+text" for x in tr.x if x is not None]
    assert max(xs) + 1 <= MAX_COLUMNS and not overlapping(label_boxes(fig))
    texts = [t for tr in fig.data if tr.mode == "markers+text" for t in tr.text]
    assert any(t.startswith("⋯") for t in texts) and {"t1", "t2", "t39", "t40"} <= set(texts)  # the middle folded


def test_step_through_stages():
    from viz.lesson import stage_sentence, stages_of
    from viz.tree_figure import STAGES

    trace = make_trace()
    assert stages_of(trace) == ["pld", "tr", "scored", "walk", "bonus"]
    drawn = {}
    for stage in STAGES:
        fig = tree_figure(trace, TEXT.get, stage=stage)
        drawn[stage] = {tr.name: len([x for x in tr.x if x is not None]) for tr in fig.data}
        assert stage_sentence(trace, stage, TEXT.get)
    assert drawn["pld"]["PLD spine"] == 3 and drawn["pld"]["TR branch"] == 0 and drawn["pld"]["bonus token"] == 0
    assert drawn["tr"]["TR branch"] == 4  # 3 TR nodes and the TR ghost
    assert drawn["walk"]["bonus token"] == 0 and drawn["bonus"]["bonus token"] == 1
    scored = tree_figure(trace, TEXT.get, stage="scored")
    marks = "".join(t for tr in scored.data if tr.mode == "markers+text" for t in tr.text)
    assert "✓" in marks and "✗" in marks
    assert "':'" in stage_sentence(trace, "bonus", TEXT.get)


def test_explain_cycle_says_why_gt_auto_chose_the_size():
    from dataclasses import replace

    from viz.explain import explain_cycle

    sized = replace(make_trace(), gt_nodes=7, gt_candidates=31, gt_expected=1.9, gt_cost_ms=5.3)
    assert "GT kept 7 of 31 nodes: 2.9 tokens expected for 5.3 ms on the cost curve" in explain_cycle(sized, TEXT.get)
    pruned = replace(make_trace(), mode="ar", tree=DraftTree.root_only(0), ghosts=(), accepted=(), new_tokens=(9,),
                     gt_nodes=1, gt_candidates=12, gt_expected=0.0, gt_cost_ms=2.5)
    text = explain_cycle(pruned, TEXT.get)
    assert text.startswith("GT kept none of the 11 drafted nodes") and "plain AR step" in text
    assert "GT" not in explain_cycle(make_trace(), TEXT.get)  # a fixed c, or a trace without the fields
