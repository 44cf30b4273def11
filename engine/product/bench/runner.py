"""The benchmark's runner: one method on one prompt as a flat record, every method on a dataset's prompts (the
order rotating), each run checked against AR's tokens."""
from __future__ import annotations

import sys
import time

import torch
from tqdm import tqdm
from transformers.generation.streamers import BaseStreamer

from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.product.bench.llamacpp import METHODS as LLAMACPP_METHODS
from engine.product.bench.llamacpp import LlamaCpp
from engine.product.bench.methods import FP32_AR, HF_METHODS, method_config
from engine.product.bench.prompts import DATASETS, encode
from engine.product.runs.decoder import make_decoder
from engine.product.runs.lossless import attribute, engine_ar_logits
from engine.product.runs.metrics import summarize
from engine.sources import SourceMemory


class Runner:
    """Runs one method on one prompt and returns a flat record."""

    def __init__(self, lm, args, base: DecodeConfig, draft=None, curve: CostCurve | None = None, fp32=None) -> None:
        self.lm, self.args, self.draft = lm, args, draft
        self.here = lm  # the model as the prompt being run runs it (``at``: its forward path for that length)
        self.base = base  # the settings every engine method starts from (the CLI's options)
        self.fp32 = fp32  # the model in fp32, for the "ar-fp32" row (the exact mode's AR), or None
        self.given = curve  # the cost curve every method reads (--cost-curve); None: each path's cached curve
        self.curves: dict[str, CostCurve] = {}  # forward path -> the curve its runs read (on first use)
        self.sessions: dict[str, SourceMemory] = {}  # --same-session: each method's memory across a dataset
        self.peer: LlamaCpp | None = None  # llama.cpp on the same GGUF file, for the llamacpp-* methods

    @property
    def curve(self) -> CostCurve | None:
        """The curve the report prices runs on: the one given, else the curve of the path the last prompt ran on."""
        return self.given or self.curves.get(self.here.forward.name)

    def at(self, prompt_ids: list[int]) -> None:
        """The next runs are of ``prompt_ids``: the model on the path a generation that long runs on
        (``LoadedModel.for_context``: each method, its AR reference and the check read it)."""
        self.here = self.lm.for_context(len(prompt_ids) + self.args.max_new_tokens)

    def new_session(self) -> None:
        """Forget what sources kept across requests (a new dataset starts a new session)."""
        self.sessions = {}

    def __call__(self, method: str, prompt_ids: list[int]) -> dict:
        return {**self.run(method, prompt_ids), "runs": self.what_runs(method)}

    def run(self, method: str, prompt_ids: list[int]) -> dict:
        if method in LLAMACPP_METHODS:
            return self.peer.run(method, prompt_ids, self.args.max_new_tokens, self.lm.eos_token_ids)
        return self.hf(method, prompt_ids) if method in HF_METHODS else self.engine(method, prompt_ids)

    def what_runs(self, method: str) -> dict:
        """What ran ``method``'s forwards ({"dtype", "forward_path", "weights"}: ``what_runs.WhatRuns``): llama.cpp's
        own methods its library on the GGUF file, transformers' methods the torch model in its precision, the fp32
        copy's AR fp32, and every engine method the model's own path (``lm.runs``)."""
        if method in LLAMACPP_METHODS:
            return {"dtype": self.peer.weight_type, "forward_path": "llama-cpp-python", "weights": "gguf"}
        if method in HF_METHODS:
            return {"dtype": self.lm.precision, "forward_path": "transformers generate", "weights": "transformers"}
        if method == FP32_AR:
            return {"dtype": "fp32", "forward_path": "eager", "weights": "transformers"}
        return self.here.runs.to_dict()

    def engine(self, method: str, prompt_ids: list[int]) -> dict:
        if method == FP32_AR:  # the exact mode's AR on its own fp32 copy: the "old default" tok/s reference
            config = DecodeConfig.of(method="ar", max_new_tokens=self.args.max_new_tokens)
            traces = list(make_decoder(self.fp32, config, self.lm.eos_token_ids).generate(prompt_ids))
            s = summarize(traces)
            return {"tokens": [t for tr in traces for t in tr.new_tokens], "seconds": s.seconds,
                    "prefill_s": s.prefill_s}
        config = self.base.with_(**method_config(method))  # the method's own settings win (a "/c=" variant too)
        memory = self.sessions.setdefault(method, SourceMemory()) if self.args.same_session else None
        path = self.here.forward.name
        decoder = make_decoder(self.here, config, self.lm.eos_token_ids, cost_curve=self.given or self.curves.get(path),
                               memory=memory, profile=self.args.profile)  # --profile on CUDA: each stage waits
        if decoder.cost_curve is not None:  # every method on a path reads the same curve
            self.curves.setdefault(path, decoder.cost_curve)
        traces = list(decoder.generate(prompt_ids))
        s = summarize(traces)
        record = {"tokens": [t for tr in traces for t in tr.new_tokens], "seconds": s.seconds,
                  "prefill_s": s.prefill_s, "forwards": s.forwards, "summary": s,
                  "gt_threshold": decoder.config.gt.threshold}
        if self.args.profile:
            record["cycles"] = [{"cycle": t.index, "mode": t.mode, "nodes": len(t.tree), "tokens": len(t.new_tokens),
                                 **dict(t.timings_ms)} for t in traces]
        return record

    @torch.no_grad()
    def hf(self, method: str, prompt_ids: list[int]) -> dict:
        eos = list(self.lm.eos_token_ids) or None
        kwargs = dict(HF_METHODS[method])
        if method == "hf-assisted":
            kwargs["assistant_model"] = self.draft.model
        ids = torch.tensor([prompt_ids], device=self.lm.model.device)
        clock = FirstTokenClock()
        out = self.lm.model.generate(ids, do_sample=False, max_new_tokens=self.args.max_new_tokens, eos_token_id=eos,
                                     pad_token_id=eos[0] if eos else None, streamer=clock, **kwargs)
        if self.lm.model.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - clock.start
        return {"tokens": out[0, len(prompt_ids):].tolist(), "seconds": seconds,
                "prefill_s": clock.first_token_s or seconds}


class FirstTokenClock(BaseStreamer):
    """A transformers streamer that only notes when ``generate`` emits its first new token: the end of the
    prefill, so HF's rows get the same decode-phase timing as the engine's (``RunSummary.prefill_s``)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.calls = 0
        self.first_token_s: float | None = None

    def put(self, value) -> None:  # first call: the prompt; second: the first generated token
        self.calls += 1
        if self.calls == 2:
            self.first_token_s = time.perf_counter() - self.start

    def end(self) -> None:
        pass



def run_dataset(run: Runner, methods: list[str], dataset: str, texts: list[str], profile: list[dict]) -> dict:
    """Every method on every prompt of ``dataset`` (the order rotating), each run checked against AR's tokens;
    returns method -> its runs in prompt order, and appends their cycles to ``profile`` (``--profile``)."""
    runs = {m: [] for m in methods}
    run.new_session()
    for k, text in enumerate(tqdm(texts, desc=dataset)):
        ids = encode(run.lm, text, DATASETS[dataset][2], run.args.max_new_tokens)
        run.at(ids)
        fastest = fastest_runs(run, methods, ids, k)
        for m in methods:
            runs[m].append(fastest[m])
            profile += [{"method": m, "dataset": dataset, "prompt": k, **c} for c in runs[m][-1].pop("cycles", [])]
        check_lossless(run.here, ids, runs, dataset, k)
    return runs


def fastest_runs(run: Runner, methods: list[str], ids: list[int], k: int) -> dict[str, dict]:
    """Each method's fastest run on prompt ``k`` (wall time) over ``--repeats``, the order rotating: no method
    always first."""
    fastest: dict[str, dict] = {}
    for r in range(run.args.repeats):
        turn = (k + r) % len(methods)
        for m in methods[turn:] + methods[:turn]:
            record = run(m, ids)
            if m not in fastest or record["seconds"] < fastest[m]["seconds"]:
                fastest[m] = record
    return fastest


def check_lossless(lm, ids: list[int], runs: dict[str, list[dict]], dataset: str, k: int) -> None:
    """Mark prompt ``k``'s last run of every method whose tokens part from AR's with its divergence (loudly when
    it is a bug); the engine's AR steps are replayed for their logits once, on the path AR ran, when a method parts
    from AR.  Only runs of the same weights on the same kernels as AR are held to it: llama.cpp's own methods, the
    fp32 copy's AR, and transformers' methods where AR ran on the GGUF file's weights (``lm.runs``) are compared by
    text alone (``same_text_as_ar``)."""
    reference = None
    others = (FP32_AR, *LLAMACPP_METHODS, *(HF_METHODS if lm.runs.weights != "transformers" else ()))
    for m in runs:
        if m in others or runs[m][-1]["tokens"] == runs["ar"][-1]["tokens"]:
            continue
        reference = engine_ar_logits(lm.model, ids, runs["ar"][-1]["tokens"], lm.forward)[1] if reference is None \
            else reference
        d = attribute(lm.model, ids, runs["ar"][-1]["tokens"], runs[m][-1]["tokens"], reference, lm.forward)
        if d is not None:
            runs[m][-1]["divergence"] = {"prompt": k, **d.to_dict()}
            print(f"\n{'!!! LOSSLESS VIOLATION' if d.kind in ('bug', 'length') else d.kind}: {m} on "
                  f"{dataset} prompt {k}: {d.sentence()}", file=sys.stderr)


