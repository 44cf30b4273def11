"""The llamacpp forward path (engine/core/forward/llamacpp/): llama.cpp's kernels behind the forward seam, on
SmolLM2's own GGUF.

Every tree row's logits equal, bit for bit, those of its root path decoded as a chain; a commit of a later branch
(and the cache compaction that keeps cells in order) continues exactly as a chain commit would; the decoding loop on
the path gives the ids of AR on the same path, and sampling on it the distribution of AR sampling on it (the statistical
test of tests/test_sampling.py, with its power check); llama.cpp tokenizes as the converted tokenizer; a tree too large
says so.  Needs the optional llama-cpp-python (skipped without it, a failure under CI) and SmolLM2's GGUF file (the
quick tier skips all but the import check: each test builds llama.cpp contexts and decodes).
"""
from __future__ import annotations

import gc
import json
import os
import random

import pytest
import torch
from conftest import DATA, SMOLLM2_CURVE
from test_sampling import N_TOKENS, P_FAIL, chi_square_p, reference_probs, sample_many

from engine.core.forward import llamacpp
from engine.core.forward.llamacpp import INSTALL, GgmlForward, GgmlPath, GgmlQ8CachePath, GgmlUnavailable
from engine.core.tree import DraftTree, Source
from engine.sources.tr import TrSource

TR = TrSource.info.source
MAX_NEW = 48
#: parent arrays: a chain, a star of 4 root children, a mixed tree (10 nodes, depth 3), the anchor alone, and two
#: chains of 35 under the root (70 rows: decoded in two chunks, ``llamacpp.TREE_CHUNK``)
SHAPES = {"chain": (None, 0, 1, 2, 3), "star": (None, 0, 0, 0, 0),
          "mixed": (None, 0, 0, 1, 1, 2, 3, 3, 5, 2), "one-node": (None,),
          "two-chains-70": (None, *range(35), 0, *range(36, 69))}
#: both KV caches' paths: Q8_0 keys with f16 values (the default), and Q8_0 both (the forward choice times each)
PATHS = {"f16-values": GgmlPath, "q8-values": GgmlQ8CachePath}
CODE = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def _tree(tokens, parents) -> DraftTree:
    n = len(tokens)
    return DraftTree(tuple(tokens), tuple(parents), (Source.ROOT,) + (TR,) * (n - 1), (1.0,) * n, (1.0,) * n)


def _random_tree(rng: random.Random, anchor: int, n: int) -> DraftTree:
    """``n`` nodes under ``anchor``: random tokens, each node's parent a random earlier node."""
    return _tree([anchor] + [rng.randrange(49152) for _ in range(n - 1)], [None] + [rng.randrange(i) for i in
                                                                                       range(1, n)])


@pytest.fixture(scope="module")
def llama_cpp_module():
    try:
        import llama_cpp
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the llamacpp forward path: install llama-cpp-python ({INSTALL})")
        pytest.skip(f"llama-cpp-python is an optional extra, not installed here ({INSTALL})")
    return llama_cpp


@pytest.fixture(scope="module")
def gguf(llama_cpp_module):
    from engine.product.models.named import SMOLLM2, FetchError, ensure_gguf

    try:
        return ensure_gguf(SMOLLM2)
    except FetchError as exc:
        pytest.skip(f"SmolLM2's GGUF file cannot be had here: {exc}")


@pytest.fixture(scope="module")
def path(gguf, smollm2_lm):
    made = GgmlPath(smollm2_lm.model, gguf, threads=1)
    yield made
    made.close()


@pytest.fixture(scope="module", params=list(PATHS))
def each_path(request, gguf, smollm2_lm):
    """The path on either KV cache (``PATHS``), one thread."""
    made = PATHS[request.param](smollm2_lm.model, gguf, threads=1)
    yield made
    made.close()


@pytest.fixture(scope="module")
def prompt(smollm2_lm) -> list[int]:
    return smollm2_lm.encode_prompt(CODE, chat=False)


def test_import_needs_no_llama_cpp_and_missing_it_says_how_to_install(without_llama_cpp):
    with pytest.raises(GgmlUnavailable, match="pip install llama-cpp-python==0.3.36"):
        GgmlPath(object(), "model.gguf")


@pytest.mark.full  # llama.cpp contexts and decodes: seconds
@pytest.mark.parametrize("shape", SHAPES)
def test_tree_rows_equal_their_paths_decoded_as_chains(each_path, prompt, shape):
    """Each row of a verified tree equals, bit for bit, the last row of its root path decoded as a chain over the
    same prefill: the chain shape one row per decode on a fresh forward, the others one chain per leaf; on either
    KV cache."""
    path, parents = each_path, SHAPES[shape]
    tree_forward = path.open(len(prompt) + 32, len(parents))
    anchor = int(tree_forward.prefill(prompt)[-1].argmax())
    rng = random.Random(shape)
    tree = _tree([anchor] + [rng.randrange(49152) for _ in parents[1:]], parents)
    rows = tree_forward.verify(tree)  # (n, |V|)
    assert rows.shape == (len(tree), 49152) and rows.dtype == torch.float32
    reference = path.open(len(prompt) + 32, len(parents))
    reference.prefill(prompt)
    want = torch.empty_like(rows)
    if shape == "chain":  # AR: one row per decode, committed
        for i, token in enumerate(tree.tokens):
            want[i] = reference.verify(DraftTree.root_only(token))[0]
            reference.commit([0])
    else:
        for leaf in (i for i in range(len(tree)) if not tree.children[i]):
            nodes = [0, *tree.path_to(leaf)]
            chain = reference.verify(DraftTree.chain([tree.tokens[i] for i in nodes], TR))  # (depth + 1, |V|)
            want[nodes] = chain
            reference.commit([])  # dropped: the next chain starts from the prefill again
    for i in range(len(tree)):
        assert torch.equal(rows[i], want[i]), (f"{shape}: node {i} differs from its chain by up to "
                                                f"{(rows[i] - want[i]).abs().max():.3g}")


@pytest.mark.full  # llama.cpp contexts and decodes: seconds
def test_commit_of_a_later_branch_continues_as_a_chain_commit(path, prompt):
    """keep = [0, 2, 3] (node 2, not node 1, and its child): the next tree's rows equal those after committing the
    same tokens as a chain.  Then 28 cycles of random trees and kept paths in 256 cells (dropped rows before a kept
    one go to the trash, the cache is compacted when full): each kept row equals its chain's, decoded on a forward
    that commits only chains."""
    prompt = prompt * 3
    forward, chain = path.open(len(prompt) + 100, 16), path.open(len(prompt) + 100, 16)  # 256 cells each
    anchor = int(forward.prefill(prompt)[-1].argmax())
    chain.prefill(prompt)
    forward.verify(_tree([anchor, 11, 22, 33, 44], [None, 0, 0, 2, 1]))
    forward.commit([0, 2, 3])
    chain.verify(DraftTree.chain([anchor, 22, 33], TR))
    chain.commit([0, 1, 2])
    nxt = _tree([33, 5, 6, 7], [None, 0, 1, 0])
    assert forward.length == chain.length == len(prompt) + 3
    assert torch.equal(forward.verify(nxt), chain.verify(nxt))
    forward.commit([0])
    chain.commit([0])
    compactions = []
    real = GgmlForward._compact

    def counted(self):
        compactions.append((self.length, self._end))
        real(self)

    rng = random.Random(0)
    nxt = _random_tree(rng, 33, 10)
    try:
        GgmlForward._compact = counted
        for cycle in range(28):
            got = forward.verify(nxt)  # (n, |V|)
            keep = [0, *nxt.path_to(rng.randrange(len(nxt) // 2, len(nxt)))]  # a later node: rows before it dropped
            want = chain.verify(DraftTree.chain([nxt.tokens[i] for i in keep], TR))  # (k, |V|)
            assert torch.equal(got[keep], want), (f"cycle {cycle}: kept rows differ from the chain's by up to "
                                                  f"{(got[keep] - want).abs().max():.3g}")
            forward.commit(keep)
            chain.commit(list(range(len(keep))))
            nxt = _random_tree(rng, int(want[-1].argmax()), rng.randint(6, 16))
    finally:
        GgmlForward._compact = real
    assert forward.length == chain.length
    assert compactions, "inconclusive: no cycle compacted the cache"


@pytest.mark.full  # two generations per prompt on llama.cpp: seconds
def test_goose_on_the_llamacpp_path_gives_the_ids_of_its_ar(each_path, smollm2_lm):
    """Greedy Goose (the default config) on the path gives token for token the ids of AR on the same path (either
    KV cache)."""
    from engine.decoding.config import DecodeConfig
    from engine.decoding.cost import CostCurve
    from engine.product.models.cost_cache import curve_key
    from engine.product.runs.decoder import make_decoder
    from engine.product.runs.metrics import summarize

    lm = smollm2_lm
    curve = CostCurve.from_spec(SMOLLM2_CURVE, key=curve_key(lm.model, each_path))  # no timing here
    code = json.loads((DATA / "humaneval" / "HumanEval.jsonl").read_text(encoding="utf-8").splitlines()[0])["prompt"]
    prompts = [lm.encode_prompt(code, chat=False),
               lm.encode_prompt("Write a Python function that adds two numbers, then the same one with a docstring.",
                                chat=True)]
    accepted = 0
    for ids in prompts:
        runs = {}
        for method in ("goose", "ar"):
            decoder = make_decoder(lm.model, DecodeConfig.of(max_new_tokens=MAX_NEW, method=method),
                                   lm.eos_token_ids, cost_curve=curve, forward=each_path)
            traces = list(decoder.generate(ids))
            runs[method] = [t for tr in traces for t in tr.new_tokens]
            if method == "goose":
                accepted += sum(n for s, n in summarize(traces).accepted_by_source.items() if s != "bonus")
        first = next((i for i, (a, b) in enumerate(zip(runs["goose"] + [-1], runs["ar"] + [-2])) if a != b), None)
        assert runs["goose"] == runs["ar"], f"Goose on the llamacpp path parts from its AR at new token {first}"
    assert accepted > 0, "inconclusive: Goose accepted no draft token on the llamacpp path"


@pytest.mark.full  # two generations and one replay on llama.cpp: seconds
def test_a_run_on_the_file_says_q4_1_and_is_held_to_its_own_ar_exactly(path, smollm2_lm, monkeypatch):
    """Issue 70: on llama.cpp's path the record names the file's type (never the torch model's dtype), the lossless
    reference is AR on the same path (never ``generate`` on the torch model), Goose equals it token for token with a
    draft accepted, and a divergence there is a bug whatever its gap (rows are bit-identical in any batch)."""
    from dataclasses import replace

    from engine.decoding.config import DecodeConfig
    from engine.decoding.cost import CostCurve
    from engine.product.models.cost_cache import curve_key
    from engine.product.runs import reference
    from engine.product.runs.decoder import make_decoder
    from engine.product.runs.lossless import attribute

    lm = replace(smollm2_lm, forward_path=path, auto_dtype=True)
    assert lm.runs.to_dict() == {"dtype": "Q4_1", "forward_path": "llamacpp", "weights": "gguf"}
    assert lm.describe().startswith("SmolLM2-135M-Instruct (135M, Q4_1 · llama.cpp kernels")
    monkeypatch.setattr(reference, "greedy_reference", lambda *a: pytest.fail("held to torch's generate"))
    ids = lm.encode_prompt(CODE, chat=False)
    want = reference.lossless_reference(lm, ids, 32)
    curve = CostCurve.from_spec(SMOLLM2_CURVE, key=curve_key(lm.model, path))
    traces = list(make_decoder(lm, DecodeConfig.of(max_new_tokens=32), lm.eos_token_ids, cost_curve=curve)
                  .generate(ids))
    assert [t for tr in traces for t in tr.new_tokens] == want
    assert sum(len(tr.accepted) for tr in traces) > 0, "inconclusive: no draft token accepted"
    wrong = want[:5] + [(want[5] + 1) % 49152] + want[6:]
    found = attribute(lm.model, ids, want, wrong, path=path)
    assert (found.kind, found.exact, found.position, found.dtype) == ("bug", True, 5, "fp32")


@pytest.mark.full  # two generations per prompt and replays on llama.cpp, one prompt past 512 cells: seconds
def test_the_noflash_path_is_held_to_its_ar_with_every_divergence_a_tie(gguf, smollm2_lm):
    """Issue 70 item 3: llama.cpp's AR kernel for long contexts (no flash attention) rounds a tree row unlike its AR
    step, so Goose there may part from its AR: each such place is attributed, a tie within ``TIE_LOGITS`` and never
    a bug; ``--forward auto`` never picks it as the model's path (its rows are not exact), only for long generations
    where it was measured cheaper (``ForwardPath.at``)."""
    from dataclasses import replace

    from engine.core.forward.llamacpp import GgmlNoFlashPath
    from engine.decoding.config import DecodeConfig
    from engine.decoding.cost import CostCurve
    from engine.product.models import forward_choice
    from engine.product.models.cost_cache import curve_key
    from engine.product.runs import reference
    from engine.product.runs.decoder import make_decoder
    from engine.product.runs.lossless import attribute

    path = GgmlNoFlashPath(smollm2_lm.model, gguf, threads=2)
    assert not path.ROWS_EXACT and path.TIE_LOGITS and "llamacpp-noflash" in forward_choice.CHOICES
    lm = replace(smollm2_lm, forward_path=path, auto_dtype=True)
    assert lm.runs.to_dict() == {"dtype": "Q4_1", "forward_path": "llamacpp-noflash", "weights": "gguf"}
    curve = CostCurve.from_spec(SMOLLM2_CURVE, key=curve_key(lm.model, path))
    code = (DATA / "humaneval" / "HumanEval.jsonl").read_text(encoding="utf-8").splitlines()
    long = "\n".join(json.loads(line)["prompt"] for line in code[:5])  # past 512 cells
    accepted = 0
    for text in (CODE, long):
        ids = lm.encode_prompt(text, chat=False)
        want = reference.lossless_reference(lm, ids, MAX_NEW)
        traces = list(make_decoder(lm, DecodeConfig.of(max_new_tokens=MAX_NEW), lm.eos_token_ids,
                                   cost_curve=curve).generate(ids))
        accepted += sum(len(t.accepted) for t in traces)
        found = attribute(lm.model, ids, want, [t for tr in traces for t in tr.new_tokens], path=path)
        assert found is None or found.kind == "precision tie", found.sentence()
    assert accepted > 0, "inconclusive: no draft token accepted"
    path.close()


@pytest.mark.full  # runs on llama.cpp over a prompt past 512 cells, and a short one: seconds
def test_auto_runs_a_long_prompt_on_the_long_path_and_its_rows_name_it(gguf, smollm2_lm):
    """Issue 70 item 3: where the forward choice measured llama.cpp's attention without flash attention cheaper over
    long contexts (``forward_choice.long_rule``), a long prompt's runs take it and a short prompt's the exact path;
    the bench's rows name the path each ran on, and each is held to AR on its own path (no bug; a tie only where
    the path's rows are not exact)."""
    from argparse import Namespace
    from dataclasses import replace

    from engine.core.forward import Longer
    from engine.core.forward.llamacpp import GgmlNoFlashPath, GgmlQ8CachePath
    from engine.decoding.config import DecodeConfig
    from engine.decoding.cost import CostCurve
    from engine.product.bench.runner import Runner, check_lossless

    exact = GgmlQ8CachePath(smollm2_lm.model, gguf, threads=2)
    exact.longer = Longer(512, GgmlNoFlashPath(smollm2_lm.model, gguf, threads=2), "long contexts: no flash attention")
    lm = replace(smollm2_lm, forward_path=exact, auto_dtype=True)
    args = Namespace(max_new_tokens=MAX_NEW, same_session=False, profile=False, repeats=1)
    run = Runner(lm, args, DecodeConfig.of(max_new_tokens=MAX_NEW), curve=CostCurve.from_spec(SMOLLM2_CURVE))
    code = (DATA / "humaneval" / "HumanEval.jsonl").read_text(encoding="utf-8").splitlines()
    long = "\n".join(json.loads(line)["prompt"] for line in code[:5])  # past 512 cells
    assert exact.longer.path.weights() == exact.weights() and exact.longer.path._model is exact._model  # one copy
    for text, ran in ((CODE, "llamacpp-q8cache"), (long, "llamacpp-noflash")):
        ids = lm.encode_prompt(text, chat=False)
        run.at(ids)
        runs = {m: [run(m, ids)] for m in ("ar", "goose")}
        assert {runs[m][0]["runs"]["forward_path"] for m in runs} == {ran}, runs["goose"][0]["runs"]
        check_lossless(run.here, ids, runs, "humaneval", 0)
        found = runs["goose"][0].get("divergence")
        assert found is None or (ran == "llamacpp-noflash" and found["kind"] == "precision tie"), found
        accepted = sum(n for src, n in runs["goose"][0]["summary"].accepted_by_source.items() if src != "bonus")
        assert accepted > 0, f"inconclusive: no draft token accepted on {ran}"
    exact.longer.path.close()
    exact.close()


@pytest.mark.full  # loads the GGUF file in llama.cpp
def test_the_paths_cost_curve_is_keyed_by_what_runs_it(path, smollm2_lm):
    """The llamacpp path's cost curve is keyed by the file's weight type, llama-cpp-python's release and the threads,
    not by the torch model's dtype or kernels (which never run a forward there): an ``auto`` precision measured
    again as another dtype reads the same curve, and a new release or thread count measures its own."""
    import llama_cpp

    from engine.product.models.cost_cache import curve_key

    key = curve_key(smollm2_lm.model, path)
    assert key.endswith(f"|Q4_1 · llama.cpp kernels · llama-cpp-python {llama_cpp.__version__} · 1 thread|llamacpp")
    assert str(smollm2_lm.model.dtype) not in key and "torch" not in key and "/" not in key.split("|")[0]
    two = GgmlPath(smollm2_lm.model, path.gguf, threads=2)
    try:
        assert curve_key(smollm2_lm.model, two) != key
    finally:
        two.close()
    assert curve_key(smollm2_lm.model) != key  # the eager path's key is the torch model's


@pytest.mark.full  # loads the GGUF file in llama.cpp
def test_llama_cpp_tokenizes_as_the_converted_tokenizer(path, smollm2_lm):
    texts = ["def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
             "Hello, world!  Two spaces,\ttabs and 3.14159 digits.", "naïve café — 東京, emoji 🦆"]
    encode = smollm2_lm.tokenizer.encode
    for text in texts:
        assert path.tokenize(text) == encode(text, add_special_tokens=False), text
    chat = "<|im_start|>user\nhi<|im_end|>\n"  # special-token text: its tokens when parsed (as transformers does)
    assert path.tokenize(chat, special=True) == encode(chat, add_special_tokens=False)
    assert len(path.tokenize(chat)) > len(encode(chat, add_special_tokens=False))  # else spelled out in pieces


@pytest.mark.full  # builds a small llama.cpp context
def test_a_tree_too_large_for_the_context_says_so(path, prompt):
    path.spares.clear()  # earlier tests' contexts dropped: the last check reads which kept context ``open`` takes
    forward = path.open(len(prompt) + 8, 1)  # 256 cells (rounded up), 16 leaf sequences
    anchor = int(forward.prefill(prompt)[-1].argmax())
    with pytest.raises(ValueError, match="does not fit this forward's 256 cells"):
        forward.verify(DraftTree.chain([anchor] * (257 - len(prompt)), TR))  # one cell too many
    with pytest.raises(ValueError, match="17 leaves .* 16 leaf sequences"):
        forward.verify(_tree([anchor] * 18, [None] + [0] * 17))  # a star of 17 leaves
    assert forward.length == len(prompt)
    forward.verify(_tree([anchor] * 17, [None] + [0] * 16))  # 16 leaves fit
    forward.commit([0])
    assert forward.length == len(prompt) + 1
    forward.verify(_tree([anchor, 1, 2], [None, 0, 0]))
    with pytest.raises(ValueError, match="root path"):
        forward.commit([0, 2, 1])
    context = forward.context
    del forward
    gc.collect()
    assert context in path.spares and path.open(8).context is context  # a finished generation's context is reused
    assert llamacpp.physical_cores() >= 1


@pytest.mark.full  # ~140 llama.cpp decodes over a long prompt, 2 threads: seconds
@pytest.mark.parametrize("cache", PATHS)
def test_one_row_steps_equal_a_batch_past_512_cells_on_two_threads(gguf, smollm2_lm, cache):
    """Past 512 cells, on 2 threads, where ggml's attention has a split kernel for one row and a tiled one for 64 rows
    or more over f16 keys and values: 70 tokens decoded one row at a time equal, bit for bit, the same tokens decoded
    as one 70-row chain (two chunks, ``TREE_CHUNK``) and as a 2-row chain at each step, because the keys are Q8_0
    (with either value type)."""
    two = PATHS[cache](smollm2_lm.model, gguf, threads=2)
    try:
        rows = (DATA / "humaneval" / "HumanEval.jsonl").read_text(encoding="utf-8").splitlines()
        ids = smollm2_lm.encode_prompt("\n".join(json.loads(row)["prompt"] for row in rows[:6]), chat=False)
        assert len(ids) > 520, len(ids)
        tokens = ids[-70:]
        steps, batch = two.open(len(ids) + 80, 70), two.open(len(ids) + 80, 70)
        steps.prefill(ids[:-70])
        batch.prefill(ids[:-70])
        one = torch.empty(70, 49152)
        for i, token in enumerate(tokens):  # one row a decode, committed
            pair = steps.verify(DraftTree.chain(tokens[i:i + 2], TR)).clone()  # (2, |V|): this row in a batch of two
            steps.commit([])
            one[i] = steps.verify(DraftTree.root_only(token))[0]
            steps.commit([0])
            gap = (pair[0] - one[i]).abs().max()
            assert torch.equal(pair[0], one[i]), f"row {i}: a 2-row batch differs by {gap:.3g}"
        chain = batch.verify(DraftTree.chain(tokens, TR))  # (70, |V|)
        for i in range(70):
            gap = (chain[i] - one[i]).abs().max()
            assert torch.equal(chain[i], one[i]), f"row {i}: the 70-row chain differs by {gap:.3g}"
    finally:
        two.close()


@pytest.mark.full  # two generations on llama.cpp over a long prompt, 2 threads: seconds
def test_goose_matches_its_ar_past_512_cells_on_two_threads(llama_cpp_module, smollm2_lm):
    """Past 512 cells, with 2 threads, f16 keys and values would send a one-row forward to a split kernel that rounds
    unlike a tree's rows (logits apart by up to ~0.7); Q8_0 keys keep every row on one kernel, so Goose still gives
    its AR's ids token for token."""
    from engine.decoding.config import DecodeConfig
    from engine.decoding.cost import CostCurve
    from engine.product.models.cost_cache import curve_key
    from engine.product.models.named import SMOLLM2, ensure_gguf
    from engine.product.runs.decoder import make_decoder

    lm = smollm2_lm
    two = GgmlPath(lm.model, ensure_gguf(SMOLLM2), threads=2)
    try:
        curve = CostCurve.from_spec(SMOLLM2_CURVE, key=curve_key(lm.model, two))
        rows = (DATA / "humaneval" / "HumanEval.jsonl").read_text(encoding="utf-8").splitlines()
        code = "\n".join(json.loads(row)["prompt"] for row in rows[:6])
        ids = lm.encode_prompt(code, chat=False)
        assert len(ids) > 520, len(ids)
        out = {}
        for method in ("goose", "ar"):
            decoder = make_decoder(lm.model, DecodeConfig.of(max_new_tokens=MAX_NEW, method=method),
                                   lm.eos_token_ids, cost_curve=curve, forward=two)
            traces = list(decoder.generate(ids))
            out[method] = ([t for tr in traces for t in tr.new_tokens], sum(len(tr.accepted) for tr in traces))
        assert out["goose"][0] == out["ar"][0]
        assert out["goose"][1] > 0, "inconclusive: no draft token accepted"
    finally:
        two.close()


#: Sampling on the path: generations per test (seeds 0..N-1), for the verifiers and the power check alike; the lossy
#: verifier fails by far at this count (p ~ 1e-71; 1e-18 at 50), each generation ~0.1-0.2 s on one thread
N_SAMPLES = 200
#: a repeated phrase: PLD drafts " three", ",", " one", ... and they are often accepted
REPEATED = "one, two, three, one, two, three, one, two,"
#: the warping: T = 0.8 and top-k 4 keep the first N_TOKENS tokens' support small (4 ** 3 cells)
WARPING = dict(temperature=0.8, sample_top_k=4)
#: the default config (its fixed curve prunes each tree to a draft or two), and Goose's trees unpruned (12 nodes, two
#: or three branches: a spine and TR branches, the SpecInfer walk over rows llama.cpp decodes with tree attention)
SAMPLERS = {"goose, the default config": {},
            "goose tree, 12 nodes": dict(gt_threshold=0.0, bypass=False, budget=12, budget_extension=0)}


@pytest.fixture(scope="module")
def sampling(path, smollm2_lm) -> tuple:
    """SmolLM2 on the path (its ``LoadedModel``), the prompt, and the exact distribution of AR sampling's first
    N_TOKENS tokens on the path: each prefix's row from a prefill and one-row steps (AR on llama.cpp), warped by
    transformers' warpers (``reference_probs``); the tokens it gives probability 0 are left out (a sample with one
    fails the test)."""
    import dataclasses

    from engine.decoding.config import DecodeConfig

    prompt = smollm2_lm.encode_prompt(REPEATED, chat=False)
    cfg = DecodeConfig.of(**WARPING)

    def ar_row(prefix: tuple[int, ...]) -> torch.Tensor:  # (|V|,) logits of the token after prompt + prefix
        forward = path.open(len(prompt) + N_TOKENS)
        row = forward.prefill(prompt)[-1]
        for token in prefix:
            row = forward.verify(DraftTree.root_only(token))[0]
            forward.commit([0])
        return row

    dist: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(N_TOKENS):
        dist = {(*p, t): dist[p] * float(q) for p in dist
                for t, q in enumerate(reference_probs(cfg, ar_row(p)[None])[0].tolist()) if q > 0}
    return dataclasses.replace(smollm2_lm, forward_path=path), prompt, dist


@pytest.fixture
def fixed_curve(monkeypatch, path, smollm2_lm):
    """GT "auto" reads SMOLLM2_CURVE for the path, not a curve measured on this machine's load: the same trees."""
    from engine.decoding.cost import CostCurve
    from engine.product.models.cost_cache import CurveOwner, curve_key

    curve = CostCurve.from_spec(SMOLLM2_CURVE, key=curve_key(smollm2_lm.model, path))
    monkeypatch.setattr(CurveOwner, "shared", lambda owner, say=None: curve)


@pytest.mark.full  # N_SAMPLES generations on llama.cpp: ~30-60 s on 2 cores
@pytest.mark.parametrize("name", SAMPLERS)
def test_sampling_on_the_llamacpp_path_keeps_the_ar_distribution(sampling, fixed_curve, name):
    """The first N_TOKENS tokens sampled on the path over seeds 0..N_SAMPLES-1 are distributed as AR sampling's on
    the path (chi-square, tests/test_sampling.py); a run that accepted few draft tokens is inconclusive and fails."""
    from engine.decoding.config import DecodeConfig

    lm, prompt, expected = sampling
    cfg = DecodeConfig.of(max_new_tokens=N_TOKENS, **WARPING, **SAMPLERS[name])
    counts, accepted = sample_many(lm, prompt, cfg, N_SAMPLES)
    assert accepted > N_SAMPLES // 10, f"inconclusive: only {accepted} draft tokens accepted in {N_SAMPLES} runs"
    p = chi_square_p(counts, expected, N_SAMPLES)
    assert p > P_FAIL, f"{name}: distribution differs from AR sampling on the path (chi-square p = {p:.2e})"


@pytest.mark.full  # N_SAMPLES generations on llama.cpp: ~30-60 s on 2 cores
def test_a_lossy_verifier_fails_the_sampling_test_on_the_llamacpp_path(sampling, fixed_curve, monkeypatch):
    """Power check at the same size: accepting drafts greedily (bonus too) under sampling is lossy."""
    import engine.decoding.decode as decode
    from engine.core.verify import greedy_walk
    from engine.decoding.config import DecodeConfig

    lm, prompt, expected = sampling
    monkeypatch.setattr(decode, "sample_walk", lambda tree, dist, gen, priority: greedy_walk(
        tree, [int(dist(i).argmax()) for i in range(len(tree))], priority))
    counts, _ = sample_many(lm, prompt, DecodeConfig.of(max_new_tokens=N_TOKENS, **WARPING), N_SAMPLES)
    p = chi_square_p(counts, expected, N_SAMPLES)
    assert p < P_FAIL, f"the lossy verifier passes (chi-square p = {p:.2e}): the test has no power at this size"
