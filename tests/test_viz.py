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
    assert all(pos[v][0] == g.nodes[v]["depth"] for v in g)
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
    assert "↵" in hovers and "target's greedy next token" in hovers and "ghost" in hovers
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


def test_cycle_segments_label_tokens_by_source():
    from viz.explain import cycle_segments

    assert cycle_segments(make_trace(), TEXT.get) == [(" f", "PLD"), ("(", "PLD"), (")", "TR"), (":", "bonus")]
