"""goose-lens: a Gradio page that streams speculative decoding and draws every cycle's draft tree.

    python app.py [--model M] [--device auto|cpu|cuda] [--dtype auto|fp32|fp16|bf16]
                  [--host 127.0.0.1] [--port 7860] [--share]

This file only wires the engine (``engine/``) to the figures (``viz/``); it holds no algorithm.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import gradio as gr

from engine.config import METHODS, ConfigError, DecodeConfig
from engine.cost import cached_cost_curve
from engine.decode import SpecDecoder
from engine.loading import LoadedModel, ModelLoadError, load_model
from engine.metrics import summarize
from viz.charts import cost_figure, speed_figure
from viz.explain import TOKEN_COLORS, cycle_segments, explain_cycle
from viz.tree_figure import tree_figure

PRESETS = json.loads((Path(__file__).parent / "assets" / "presets.json").read_text(encoding="utf-8"))
UPDATE_EVERY_S = 0.15  # the page redraws at most this often; every cycle is still recorded in the state
CSS = "#stats {font-size: 1.05em} #draft-tree {min-height: 380px}"

METHOD_LABELS = {"goose": "Goose (PLD spine + TR branches)", "pld": "PLD only (chain)", "tr": "TR only (tree)",
                 "iso3": "Iso(3): balanced 3-ary tree", "iso5": "Iso(5): balanced 5-ary tree", "ar": "AR (no drafting)"}


def check_inputs(lm: LoadedModel, prompt: str, budget, max_new_tokens) -> tuple[list[int] | None, str | None]:
    """Prompt ids, or a message saying what is wrong with the input (shown in the page, never raised)."""
    if not prompt or not prompt.strip():
        return None, "The prompt is empty: type one or pick a preset."
    if max_new_tokens is None or int(max_new_tokens) <= 0:
        return None, "Max new tokens must be at least 1."
    if budget is None or int(budget) < 1:
        return None, "The node budget B must be at least 1 (B counts the anchor, so B = 1 means plain AR)."
    ids = lm.encode_prompt(prompt)
    problem = lm.context_problem(len(ids), int(max_new_tokens))
    return (None, problem) if problem else (ids, None)


def stats_line(summary, trace, c: float) -> str:
    src = summary.accepted_by_source
    return (f"**τ {summary.tau:.2f}** · **{summary.tok_per_s:.1f} tok/s** · {summary.cycles} cycles · "
            f"{summary.new_tokens} tokens — by source: PLD {src['pld']} · TR {src['tr']} · PTD {src['ptd']} · "
            f"bonus {src['bonus']} · last cycle: {trace.mode}, {len(trace.tree)} nodes, "
            f"{len(trace.new_tokens)} tokens, r = {trace.spine_ratio if trace.spine_ratio is not None else '–'}, "
            f"c = {c:.3f}")


def generate(prompt, method, budget, auto_r, spine_ratio, depth, auto_c, gt_threshold, max_new_tokens, bypass, pace,
             show_ghosts, run, *, lm: LoadedModel):
    """Stream (text, tree figure, speed figure, stats, run state) while decoding; one yield per redraw."""
    ids, problem = check_inputs(lm, prompt, budget, max_new_tokens)
    if problem is None:
        try:
            config = DecodeConfig(method=method, budget=int(budget), max_depth=int(depth),
                                  spine_ratio=None if auto_r else float(spine_ratio),
                                  gt_threshold="auto" if auto_c else float(gt_threshold),
                                  max_new_tokens=int(max_new_tokens), bypass=bool(bypass))
        except ConfigError as exc:
            problem = str(exc)
    if problem is not None:
        gr.Warning(problem)
        yield gr.skip(), gr.skip(), gr.skip(), f"⚠️ {problem}", run, gr.skip(), gr.skip()
        return
    token_text = lambda i: lm.tokenizer.decode([i])  # noqa: E731
    segments: list[tuple[str, str]] = []  # the output, token by token, labelled by source
    last_draw = 0.0
    try:
        decoder = SpecDecoder(lm.model, config, lm.eos_token_ids)  # resolves c = "auto"
        run = {"model": lm.name, "prompt": prompt, "config": decoder.config.to_dict(), "traces": [],
               "token_cycles": []}  # cycle index of every output token (click a token -> its cycle)
        for trace in decoder.generate(ids):
            run["traces"].append(trace)
            segments.extend(cycle_segments(trace, token_text))
            run["token_cycles"].extend([trace.index] * len(trace.new_tokens))
            if trace.finished or time.perf_counter() - last_draw >= UPDATE_EVERY_S or pace:
                last_draw = time.perf_counter()
                tree = tree_figure(trace, token_text, show_ghosts=bool(show_ghosts))
                stats = stats_line(summarize(run["traces"]), trace, decoder.config.gt_threshold)
                scrubber = gr.Slider(maximum=max(1, trace.index), value=trace.index)
                yield (list(segments), tree, speed_figure(run["traces"]), stats, run, scrubber,
                       explain_cycle(trace, token_text))
                if pace:
                    time.sleep(float(pace))
    except Exception as exc:  # noqa: BLE001 - keep serving; the user sees why this run stopped
        yield gr.skip(), gr.skip(), gr.skip(), f"⚠️ generation stopped: {type(exc).__name__}: {exc}", run, gr.skip(), \
            gr.skip()


def show_cycle(run, index, show_ghosts, step: int = 0, *, lm: LoadedModel):
    """Scrubber: redraw the tree and its explanation for recorded cycle ``index + step`` of the run."""
    if not run or not run["traces"]:
        return gr.skip(), gr.skip(), "Generate first: the scrubber steps through the cycles of the last run."
    k = max(0, min(int(index) + int(step), len(run["traces"]) - 1))
    trace = run["traces"][k]
    token_text = lambda i: lm.tokenizer.decode([i])  # noqa: E731
    return k, tree_figure(trace, token_text, show_ghosts=bool(show_ghosts)), explain_cycle(trace, token_text)


def jump_to_token(run, show_ghosts, evt: gr.SelectData, *, lm: LoadedModel):
    """Clicking an output token shows the cycle that produced it."""
    if not run or not isinstance(evt.index, int) or not 0 <= evt.index < len(run.get("token_cycles", [])):
        return gr.skip(), gr.skip(), gr.skip()
    return show_cycle(run, run["token_cycles"][evt.index], show_ghosts, lm=lm)


def build_demo(lm: LoadedModel) -> gr.Blocks:
    """The page. Per-user data lives in ``gr.State``; the model is shared read-only."""
    with gr.Blocks(title="goose-lens") as demo:
        gr.Markdown(f"# goose-lens — speculative decoding, one draft tree per cycle\n"
                    f"Model: `{lm.name}` on {lm.device} ({str(lm.dtype).removeprefix('torch.')}). "
                    f"Nodes are coloured by source: **PLD spine** (n-gram prompt lookup), **TR branch** "
                    f"(Token Recycling adjacency table), **PTD perturbation**; the accepted path is thick and the "
                    f"star is the bonus token. Greedy decoding: the output equals plain AR exactly.")
        run = gr.State(None)
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                preset = gr.Dropdown([p["label"] for p in PRESETS], label="Preset prompt", value=None)
                prompt = gr.Textbox(label="Prompt", lines=8, placeholder="Type a prompt or pick a preset")
                method = gr.Dropdown([(v, k) for k, v in METHOD_LABELS.items()], value="goose", label="Method")
                budget = gr.Slider(1, 128, value=60, step=1, label="Node budget B (anchor included)")
                auto_r = gr.Checkbox(value=True, label="Adaptive spine ratio r (EMA tiers)")
                spine_ratio = gr.Slider(0.05, 0.95, value=0.5, step=0.05, label="Spine ratio r (when not adaptive)")
                depth = gr.Slider(1, 16, value=6, step=1, label="Max depth D")
                auto_c = gr.Checkbox(value=True, label="Auto GT threshold c (from the measured cost curve)")
                gt = gr.Slider(0.0, 0.5, value=0.0, step=0.01, label="GT threshold c when not auto (0 = off)")
                max_new = gr.Slider(1, 1024, value=128, step=1, label="Max new tokens")
                bypass = gr.Checkbox(value=True, label="Bypass: verify confident PLD matches as a chain")
                pace = gr.Slider(0.0, 2.0, value=0.0, step=0.1, label="Slow motion (s pause per cycle)")
                show_ghosts = gr.Checkbox(value=True, label="Show GT-pruned candidates as ghosts")
                with gr.Row():
                    go_btn = gr.Button("Generate", variant="primary")
                    stop_btn = gr.Button("Stop", variant="stop")
                gr.Markdown("Presets: " + "; ".join(f"{p['label']} ({p['license']})" for p in PRESETS),
                            elem_classes=["small"])
            with gr.Column(scale=2):
                stats = gr.Markdown("Pick a preset and press **Generate**.", elem_id="stats")
                tree_plot = gr.Plot(label="Draft tree of the latest cycle", show_label=False, elem_id="draft-tree")
                explain = gr.Markdown(elem_id="explain")
                with gr.Row(equal_height=True):
                    back_btn = gr.Button("◀", scale=0, min_width=48, elem_id="cycle-back")
                    scrubber = gr.Slider(0, 1, value=0, step=1, label="Cycle (scrub or step through every recorded cycle)",
                                         elem_id="cycle-scrubber")
                    fwd_btn = gr.Button("▶", scale=0, min_width=48, elem_id="cycle-forward")
                output = gr.HighlightedText(label="Output so far, coloured by the source of each token "
                                                  "(click a token to see its cycle)", color_map=TOKEN_COLORS,
                                            show_legend=True, combine_adjacent=False, elem_id="output")
                speed_plot = gr.Plot(label="Speed and τ per cycle", elem_id="speed-chart")
                with gr.Accordion("Verification cost curve and the auto GT threshold c", open=False):
                    cost_plot = gr.Plot(cost_figure(cached_cost_curve(lm.model), 60), show_label=False,
                                        elem_id="cost-curve")
                    remeasure = gr.Button("Re-measure on this device")
        preset.change(lambda label: next(p["prompt"] for p in PRESETS if p["label"] == label) if label else gr.skip(),
                      preset, prompt, api_visibility="private")
        event = go_btn.click(partial(generate, lm=lm),
                             [prompt, method, budget, auto_r, spine_ratio, depth, auto_c, gt, max_new, bypass, pace, show_ghosts,
                              run],
                             [output, tree_plot, speed_plot, stats, run, scrubber, explain], api_name="generate",
                             concurrency_limit=1, concurrency_id="model")
        def on_token_select(run_state, ghosts, evt: gr.SelectData):  # gradio injects evt by annotation
            return jump_to_token(run_state, ghosts, evt, lm=lm)

        output.select(on_token_select, [run, show_ghosts], [scrubber, tree_plot, explain], api_visibility="private")
        for trigger, step in ((scrubber.release, 0), (back_btn.click, -1), (fwd_btn.click, 1)):
            trigger(partial(show_cycle, step=step, lm=lm), [run, scrubber, show_ghosts], [scrubber, tree_plot, explain],
                    api_visibility="private")
        stop_btn.click(None, None, None, cancels=[event], api_visibility="private")
        remeasure.click(lambda b: cost_figure(cached_cost_curve(lm.model, refresh=True), int(b)), budget, cost_plot,
                        api_visibility="private", concurrency_id="model", concurrency_limit=1)
        budget.change(lambda b: cost_figure(cached_cost_curve(lm.model), int(b)), budget, cost_plot,
                      api_visibility="private")
    return demo


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="goose-lens: visual debugger for training-free speculative decoding")
    ap.add_argument("--model", default=None, help="hub id or local path (default: the embedded demo model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--share", action="store_true", help="create a public gradio.live link")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        lm = load_model(args.model, device=args.device, dtype=args.dtype)
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lm.warm_up()  # the first Generate should not pay for torch's lazy initialisation
    demo = build_demo(lm)
    demo.queue(default_concurrency_limit=1).launch(server_name=args.host, server_port=args.port, share=args.share,
                                                   css=CSS, theme=gr.themes.Soft())
    return 0


if __name__ == "__main__":
    sys.exit(main())
