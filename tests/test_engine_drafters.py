"""Fidelity of the engines' drafters (issue 35): drafts on hand-made token sequences, each case following from the
engine's code at the version its module names.

- vLLM ngram: ``vllm/v1/spec_decode/ngram_proposer.py`` ``_find_longest_matched_ngram_and_propose_tokens`` (commit
  adce4e9a); the cases are that function's results (its docstring example first).
- vLLM suffix: Arctic Inference ``csrc/suffix_decoding/suffix_tree.cc`` ``SuffixTree::speculate`` /
  ``_speculate_path`` (v0.1.0 onward), results of the compiled C++ on the same trees; and, where
  ``scripts/engine_drafters.sh`` built them (CI does), the compiled ``SuffixTree`` and ``SuffixDecodingCache`` of
  0.3.0 against ours on random histories.
- SGLang NGRAM: ``ngram_corpus/trie.cpp`` ``buildRecency`` / ``buildFrequency`` (0.5.23); the draft sets of the
  compiled 0.5.5 C++ on the same trie (the two versions agree on these cases; 0.5.23 also drops anchors without
  children, as here); and 0.5.23's compiled n-gram corpus against the source on random requests, where built.
- llama.cpp ngram-simple: ``common/ngram-map.cpp`` ``common_ngram_simple_draft`` (b10309), the worked example of its
  backward scan first.
"""
from __future__ import annotations

import pytest

from engine.core.estimates import AcceptanceStats
from engine.decoding.config import DecodeConfig
from engine.sources import Request, SourceMemory, Verified, make_sources
from engine.sources.llamacpp_ngram import simple_draft
from engine.sources.sglang_ngram import NgramTrie, SglangNgramConfig, _bfs, _prob
from engine.sources.vllm_ngram import FirstOccurrences
from engine.sources.vllm_suffix import OrderedTrie


def vllm_ngram(tokens: list[int], lo: int, hi: int, k: int) -> list[int]:
    index = FirstOccurrences(lo, hi)
    index.extend(tokens)
    return list(index.draft(k, tokens)[0])


@pytest.mark.parametrize("tokens, lo, hi, k, draft", [
    ([1, 2, 3, 4, 2, 3], 2, 3, 4, [4, 2, 3]),  # the function's docstring example
    ([5, 1, 2, 9, 1, 2, 8, 1, 2], 2, 2, 3, [9, 1, 2]),  # tie between occurrences: the earliest
    ([1, 2, 7, 0, 3, 1, 2, 6, 0, 3, 1, 2], 1, 3, 3, [6, 0, 3]),  # a longer match beats an earlier shorter one
    ([7, 7, 7, 7, 7], 2, 3, 4, [7, 7]),  # the occurrence may overlap the suffix; the context's end cuts the draft
    ([1, 2, 1, 2, 1, 2], 2, 2, 5, [1, 2, 1, 2]),  # match at the end: fewer than k tokens follow
    ([1, 2, 3, 4, 5, 3], 2, 3, 4, []),  # no match of min tokens or more
    ([1, 2, 3, 9, 2, 3], 3, 3, 4, []),  # a shorter match below the window's minimum does not count
    ([1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5], 2, 3, 3, [0, 1, 2]),  # the window's maximum caps the match
    ([1, 1], 3, 5, 3, []),  # a context shorter than the minimum
    ([10, 11, 12, 13, 14, 15, 16, 10, 11, 12, 13, 14], 5, 5, 3, [15, 16, 10]),  # vLLM's defaults: min = max = 5
])
def test_vllm_ngram_drafts_as_vllm(tokens, lo, hi, k, draft):
    assert vllm_ngram(tokens, lo, hi, k) == draft


def test_vllm_ngram_index_grows_with_the_context():
    """Indexed incrementally, the draft is the one a fresh index of the whole context gives."""
    index = FirstOccurrences(2, 3)
    seq = [1, 2, 3, 4, 2, 3, 4, 1, 2, 3]
    for i in range(len(seq)):
        index.extend(seq[len(index.tokens):i + 1])
        assert list(index.draft(4, seq[:i + 1])[0]) == vllm_ngram(seq[:i + 1], 2, 3, 4)


def suffix_tree(seqs: list[list[int]], depth: int = 24) -> OrderedTrie:
    trie = OrderedTrie(depth)
    for s in seqs:
        trie.start()
        trie.append(s)
    return trie


@pytest.mark.parametrize("seqs, context, most, factor, depth, tokens, probs", [
    # a node counts the occurrence at the sequence's end too: "4" always followed "1 2 3", yet reads 0.5
    ([[1, 2, 3, 4, 5, 9, 1, 2, 3]], [1, 2, 3, 4, 5, 9, 1, 2, 3], 24, 1.0, 24, [4, 5, 9], [.5, .5, .5]),
    ([[1, 2, 3, 4, 5, 9, 1, 2, 3]], [1, 2, 3, 4, 5, 9, 1, 2, 3], 1, 1.0, 24, [4], [.5]),  # num_speculative_tokens
    ([[1, 2, 3, 4, 5, 9, 1, 2, 3]], [1, 2, 3, 4, 5, 9, 1, 2, 3], 24, 0.5, 24, [4], [.5]),  # int(3 x 0.5) = 1
    ([[7, 8, 1, 7, 8, 1, 7, 8, 2, 7, 8]], [7, 8, 1, 7, 8, 1, 7, 8, 2, 7, 8], 24, 1.0, 24, [1, 7], [.5, .5]),
    ([[10, 11, 12, 13, 14, 15], [10, 11, 12, 13, 20, 21], [10, 11, 12, 13, 14, 15]], [99, 12, 13], 24, 1.0, 24,
     [14, 15], [2 / 3, 2 / 3]),  # the most frequent child; the running product
    ([[10, 11, 12, 13, 14, 15], [10, 11, 12, 13, 20, 21]], [12, 13], 24, 1.0, 24, [14], [.5]),  # window limit: a
    # two-token pattern tries a one-token match only
    ([[5, 6, 1], [5, 6, 2]], [0, 5, 6], 24, 1.0, 24, [1], [.5]),  # a tie between children: the first inserted
    ([[5, 6, 1], [5, 6, 2], [5, 6, 1]], [0, 5, 6], 24, 1.0, 24, [1], [2 / 3]),
    ([[1, 2, 3, 4, 5, 6, 7, 8]], [0, 1, 2], 24, 1.0, 4, [3, 4], [1, 1]),  # depth 4: match 2 + 2 drafted
    ([[1, 2, 3, 4, 5, 6, 7, 8]], [0, 1], 24, 10.0, 4, [2, 3, 4], [1, 1, 1]),  # the depth caps match + draft
    ([[1, 2, 3]], [7, 8, 9], 24, 1.0, 24, [], []),  # no match
])
def test_vllm_suffix_speculates_as_arctic(seqs, context, most, factor, depth, tokens, probs):
    got, got_probs, *_ = suffix_tree(seqs, depth).speculate(context, most, factor, 0.1)
    assert got == tokens and got_probs == pytest.approx(probs)


def test_vllm_suffix_sibling_order_follows_arctic_after_removal():
    """A removed response takes its counts back out; the order of equal counts is Arctic's (head of the group)."""
    trie = suffix_tree([[5, 6, 1], [5, 6, 2], [5, 6, 2]])
    assert trie.speculate([0, 5, 6], 24, 1.0, 0.1)[0] == [2]
    trie.remove([5, 6, 2])
    assert trie.count[trie.find([5, 6])] == 2 and trie.speculate([0, 5, 6], 24, 1.0, 0.1)[0] == [2]  # 2 first
    trie.remove([5, 6, 1])
    assert trie.children(trie.find([5, 6])) == [2] and trie.count[0] == 3
    trie.remove([5, 6, 2])  # everything out: the freed nodes are unlinked, and reused by the next sequence
    assert trie.child == {} and trie.first == {} and trie.order == {} and trie.count[0] == 0
    trie.start()
    trie.append([7, 8])
    assert trie.find([7, 8]) is not None and trie.find([5]) is None and len(trie.count) == 10  # no new ids


def sglang_trie(seqs: list[list[int]]) -> NgramTrie:
    trie = NgramTrie(18, 10_000)
    for s in seqs:
        trie.insert(s)
    return trie


SGL_SEQS = [list(range(1, 11)), [1, 2, 3, 44, 55, 66, 77, 88, 99, 100], list(range(1, 11))]


@pytest.mark.parametrize("match_type, context, drafts", [
    ("BFS", [1, 2, 3], {44, 55, 66, 4, 5, 6, 7}),  # two branches, breadth by recency
    ("PROB", [1, 2, 3], {4, 5, 6, 7, 8, 9, 10}),  # freq(4) = 2 beats freq(44) = 1 all the way down
    ("BFS", [3, 44], {55, 66, 77, 88, 99, 100}),  # fewer nodes than slots (SGLang pads with token 0)
    ("BFS", [3, 6, 999], set()),  # no match
])
def test_sglang_ngram_drafts_as_sglang(match_type, context, drafts):
    own = SglangNgramConfig(speculative_num_draft_tokens=8, speculative_ngram_match_type=match_type)
    trie = sglang_trie(SGL_SEQS)
    build = _bfs if match_type == "BFS" else _prob
    cands = build(trie.anchors(context), own.speculative_num_draft_tokens - 1, own)
    assert set(cands.tokens) == drafts and len(cands) == len(drafts)
    chains = {}  # every drafted node hangs under its trie parent
    for tok, parent in zip(cands.tokens, cands.parents):
        chains[tok] = None if parent is None else cands.tokens[parent]
    if match_type == "BFS" and context == [1, 2, 3]:
        assert chains == {4: None, 44: None, 5: 4, 55: 44, 6: 5, 66: 55, 7: 6}


def test_sglang_ngram_breadth_narrows_with_the_match():
    """A longer match gets a narrower tree: (M - w) x scale + min breadth children at the first level."""
    trie = sglang_trie([[1, 2, 3, k] for k in range(10, 20)])
    own = SglangNgramConfig()
    wide = _bfs(trie.anchors([9, 3]), 11, own)  # w = 1 ("3"): breadth (17 - 1) x 9/17 + 1 = 9.5 -> 9
    assert len(wide.roots()) == 9
    narrow = _bfs(trie.anchors([1, 2, 3])[:1], 11, own)  # w = 3 alone: breadth (17 - 3) x 9/17 + 1 = 8.4 -> 8
    assert len(narrow.roots()) == 8


def test_sglang_ngram_inserts_after_each_step_not_at_prefill():
    """The prompt is not inserted at prefill: the first cycle drafts nothing from it."""
    cfg = DecodeConfig.of(method="sglang-ngram")
    (src,) = make_sources(cfg, AcceptanceStats(), SourceMemory())
    src.prefill([1, 2, 3, 4, 1, 2, 3], None)
    assert len(src.propose(Request([1, 2, 3, 4, 1, 2, 3]))) == 0


@pytest.mark.parametrize("context, n, m, draft", [
    ([99, 1, 2, 7, 8, 3, 4, 1, 2], 2, 2, (7, 8)),  # the module's worked example (sampled token 2)
    ([99, 1, 2, 7, 8, 3, 4, 1, 9], 2, 2, ()),  # no match
    ([1, 2, 7, 8, 1, 2, 5, 6, 0, 1, 2], 2, 2, (5, 6)),  # ties between occurrences: the most recent
    ([1, 2, 5, 6, 7, 8, 9, 0, 1, 2], 2, 2, ()),  # position 0 is never matched
    ([1, 2, 7, 8, 9], 2, 2, ()),  # history of n + m + 1 tokens or fewer: nothing
    ([9, 1, 2, 7, 3, 4, 5, 6, 1, 2], 2, 5, (7, 3, 4, 5, 6)),  # up to m tokens after the match
    ([9] * 8 + [1] * 5, 3, 3, ()),  # fewer than n tokens follow the most recent occurrence
])
def test_llamacpp_ngram_simple_drafts_as_llamacpp(context, n, m, draft):
    assert simple_draft(context, n, m) == draft


def engine_drafter(module: str, what: str):
    """An engine's own drafter, built on a CPU by scripts/engine_drafters.sh (``.engines/``, on the path from
    conftest); skipped with a sentence without it, except under CI (``CI`` set: .ci/run builds it)."""
    import importlib
    import os

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is not built: .ci/run builds it with scripts/engine_drafters.sh")
        pytest.skip(f"{what} is not built here (scripts/engine_drafters.sh builds it on a CPU)")


@pytest.fixture(scope="module")
def arctic():
    """Arctic Inference's suffix decoding module (vLLM's suffix drafter)."""
    return engine_drafter("arctic_inference.suffix_decoding", "Arctic Inference's suffix tree")


def test_vllm_suffix_trie_speculates_as_arctic_on_random_histories(arctic):
    """Arctic's C++ ``SuffixTree`` and ``OrderedTrie`` take the same random sequences, extended in pieces and removed
    (small vocabularies: many ties), then speculate on random contexts: the same tokens, probabilities, score and
    match length, bit for bit (both in single precision)."""
    import random

    from arctic_inference.suffix_decoding._C import SuffixTree

    for seed in range(150):
        rng = random.Random(seed)
        depth, vocab = rng.choice([3, 5, 8, 24]), rng.choice([2, 3, 5, 12])
        theirs, ours = SuffixTree(depth), OrderedTrie(depth)
        seqs: dict[int, list[int]] = {}
        opened: dict[int, list[int]] = {}
        for _ in range(200):
            op = rng.random()
            if op < 0.5 or not seqs:
                sid, tokens = rng.randrange(6), [rng.randrange(vocab) for _ in range(rng.randint(1, 7))]
                theirs.extend(sid, tokens)
                opened[sid] = ours.grow(tokens, opened.get(sid, []))
                seqs.setdefault(sid, []).extend(tokens)
            elif op < 0.6:
                sid = rng.choice(list(seqs))
                theirs.remove(sid)
                ours.remove(seqs.pop(sid))
                del opened[sid]
            else:
                context = [rng.randrange(vocab) for _ in range(rng.randint(1, depth))]
                most, factor = rng.choice([1, 3, 5, 24]), rng.choice([0.3, 0.5, 1.0, 2.0])
                min_prob = rng.choice([0.0, 0.1, 0.3])
                draft = theirs.speculate(context, most, factor, 0.0, min_prob, False)
                got = ours.speculate(context, most, factor, min_prob)
                assert got == (list(draft.token_ids), list(draft.probs), draft.match_len, draft.score), (seed, context)


def test_vllm_suffix_source_drafts_as_arctic_cache(arctic):
    """vLLM's flow (``vllm/v1/spec_decode/suffix_decoding.py``): each request starts with its prompt, adds each
    step's verified tokens, then speculates on the last ``max_tree_depth`` tokens; the global tree keeps the last
    ``max_cached_requests`` responses.  The source drafts what Arctic's ``SuffixDecodingCache`` drafts at each
    step of six random requests."""
    import random

    rng = random.Random(0)
    depth, cached, k = 8, 2, 6
    cache = arctic.SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=cached)
    cfg = DecodeConfig.of(method="vllm-suffix", gt_threshold=0.0, vllm_suffix_decoding_max_tree_depth=depth,
                          vllm_suffix_decoding_max_cached_requests=cached, vllm_suffix_num_speculative_tokens=k)
    memory, drafted = SourceMemory(), 0
    for req in range(6):
        prompt = [rng.randrange(4) for _ in range(rng.randint(2, 12))]
        (src,) = make_sources(cfg, AcceptanceStats(), memory)
        src.prefill(prompt, None)
        cache.start_request(req, prompt)
        context = list(prompt)
        for _ in range(25):
            draft = cache.speculate(req, context, max_spec_tokens=k, max_spec_factor=1.0, min_token_prob=0.1)
            assert src.propose(Request(context)).tokens == tuple(draft.token_ids), (req, context)
            drafted += len(draft.token_ids)
            new = [rng.randrange(4) for _ in range(rng.randint(1, 3))]
            cache.add_active_response(req, new)
            context += new
        cache.stop_request(req)  # the last step's tokens are in the global tree: the source's too, once finished
        src.observe(Verified(None, 0, None, None, (), tuple(new), context[len(prompt):], finished=True))
    assert drafted > 100  # inconclusive otherwise


def _paths(tokens, parents) -> set[tuple[int, ...]]:
    """A draft tree as the set of its nodes' root paths (sibling order aside: SGLang's is a hash map's)."""
    def path(i):
        return () if i is None else (*path(parents[i]), tokens[i])
    return {path(i) for i in range(len(tokens))}


@pytest.mark.parametrize("match_type, depth, n, vocab, capacity", [
    ("BFS", 6, 12, 4, 1_000_000), ("PROB", 6, 12, 4, 1_000_000),  # small vocabulary: ties everywhere
    ("BFS", 18, 12, 12, 1_000_000), ("PROB", 18, 12, 12, 1_000_000),  # SGLang's defaults
    ("BFS", 4, 6, 3, 60), ("PROB", 8, 12, 5, 200),  # a small capacity: least recently used leaves evicted
])
def test_sglang_ngram_source_drafts_as_sglang_corpus(match_type, depth, n, vocab, capacity):
    """SGLang's own n-gram corpus (0.5.23's C++, scripts/engine_drafters.sh) and the source, fed as SGLang's NGRAM
    worker feeds it (``ngram_worker.py``: match the last ``max_trie_depth`` tokens, verify, insert them): the same
    draft trees, node for node, at every step of five random requests sharing one trie, for eight seeds."""
    import random

    corpus_mod = engine_drafter("sglang_ngram", "SGLang's n-gram corpus")
    cfg = DecodeConfig.of(method="sglang-ngram", gt_threshold=0.0, max_depth=n, speculative_ngram_match_type=match_type,
                          speculative_ngram_max_trie_depth=depth, speculative_num_draft_tokens=n,
                          sglang_memory_nodes=capacity)
    drafted = 0
    for seed in range(8):
        rng = random.Random(seed)
        corpus, memory = corpus_mod.Corpus(capacity, depth, 1, 10, n, match_type), SourceMemory()
        for req in range(5):
            prompt = [rng.randint(1, vocab) for _ in range(rng.randint(2, 10))]  # no token 0: SGLang's padding
            (src,) = make_sources(cfg, AcceptanceStats(), memory)
            src.prefill(prompt, None)
            context = list(prompt)
            for step in range(20):
                tokens, mask = corpus.match(req, context[-depth:], len(context))
                theirs = {tuple(tokens[j] for j in range(1, i + 1) if mask[i * n + j])
                          for i in range(1, n) if tokens[i] != 0}
                cands = src.propose(Request(context))
                assert _paths(cands.tokens, cands.parents) == theirs, (seed, req, step)
                drafted += len(theirs)
                new = [rng.randint(1, vocab) for _ in range(rng.randint(1, 3))]
                context += new
                src.observe(Verified(None, 0, None, None, (), tuple(new), context[len(prompt):], step == 19))
                corpus.insert([context[-depth:]])
    assert drafted > 2000  # inconclusive otherwise


@pytest.mark.parametrize("method, engine, key", [
    ("vllm-ngram", "vLLM", "prompt_lookup_max"), ("vllm-suffix", "vLLM", "suffix_decoding_max_tree_depth"),
    ("sglang-ngram", "SGLang", "speculative-ngram-match-type"), ("llamacpp-ngram", "llama.cpp", "spec-type"),
    ("pld", "vLLM", "prompt_lookup_min"), ("suffix", "vLLM", "suffix_decoding_min_token_prob"),
    ("goose", "SGLang", "speculative-num-draft-tokens"), ("tr", "SGLang", "speculative-algorithm"),
])
def test_every_method_says_the_engine_setting_that_serves_its_drafter(method, engine, key):
    """Flags out: an engine's drafter at c = 0 is the engine's own (nothing differs); goose-lens's methods name the
    nearest and what differs; no command holds a path of this machine."""
    from engine.product.io.deploy import serving_dict

    found = serving_dict(DecodeConfig.of(method=method, gt_threshold=0.0))
    assert found["engine"] == engine and key in found["flags"] and "MODEL" in found["command"]
    assert (found["differs"] == "") == (method in ("vllm-ngram", "llamacpp-ngram"))  # vllm-suffix: its global tree
    assert "GT rule" in serving_dict(DecodeConfig.of(method=method))["differs"]  # GT auto may verify fewer


def test_sglang_serve_says_when_d_cuts_its_trees():
    from engine.product.io.deploy import serving_dict

    assert "set D >= 11" in serving_dict(DecodeConfig.of(method="sglang-ngram", gt_threshold=0.0))["differs"]
    assert "set D" not in serving_dict(DecodeConfig.of(method="sglang-ngram", max_depth=11))["differs"]


def test_the_page_bounds_what_a_visitor_may_raise():
    """On a shared server a drafter setting goes no higher than the page's bound (128), and a memory bound no higher
    than its default; lowering is fine, and the command line has no bound."""
    from engine.decoding.config import ConfigError
    from page.settings import PageSettings

    page = PageSettings(prompt="x", method="vllm-ngram")
    assert page.to_config().source_config("vllm-ngram").prompt_lookup_max == 5
    with pytest.raises(ConfigError, match="above this page's bound, 128"):
        PageSettings(prompt="x", method="vllm-ngram", drafter="prompt_lookup_max=1000000").to_config()
    with pytest.raises(ConfigError, match="above this page's bound, 100000"):
        PageSettings(prompt="x", method="sglang-ngram", drafter="memory_nodes=1000000000").to_config()
    lowered = PageSettings(prompt="x", method="sglang-ngram", drafter="memory_nodes=500").to_config()
    assert lowered.source_config("sglang-ngram").memory_nodes == 500
    from engine.product.io.deploy import with_drafter

    assert with_drafter(DecodeConfig.of(method="vllm-ngram"), "prompt_lookup_max=400, prompt_lookup_min=300"
                        ).source_config("vllm-ngram").prompt_lookup_max == 400


def test_vllm_ngram_takes_a_bound_left_out_from_the_other_as_vllm_does():
    """``vllm/config/speculative.py``: both bounds unset -> 5..5; one unset -> the other's value (the docs' example
    gives ``prompt_lookup_max`` 4 alone)."""
    from engine.product.io.deploy import with_drafter

    def bounds(text):
        own = with_drafter(DecodeConfig.of(method="vllm-ngram"), text).source_config("vllm-ngram")
        return own.prompt_lookup_min, own.prompt_lookup_max

    assert bounds("num_speculative_tokens=5") == (5, 5)
    assert bounds("prompt_lookup_max=4, num_speculative_tokens=5") == (4, 4)
    assert bounds("--prompt-lookup-min 8") == (8, 8)
    assert bounds("prompt_lookup_min=2, prompt_lookup_max=6") == (2, 6)


def test_a_visitor_keeps_one_tree_per_source_whatever_settings_they_try():
    memory = SourceMemory()
    for depth in (8, 16, 24, 16):
        cfg = DecodeConfig.of(method="vllm-suffix", vllm_suffix_decoding_max_tree_depth=depth)
        (src,) = make_sources(cfg, AcceptanceStats(), memory)
        assert src.memory.trie.depth == depth
    assert len(memory.slots) == 1


def test_drafter_settings_round_trip_through_the_command_line():
    """Flags in: the drafter text the page shows, and the command the page writes, make the same config again."""
    import shlex

    from cli.generate import parse_args
    from engine.product.io.deploy import drafter_text, with_drafter
    from engine.product.io.options import command_line, config_from_args

    config = with_drafter(DecodeConfig.of(method="sglang-ngram"), "speculative_ngram_match_type=PROB, "
                                                                  "--speculative-num-draft-tokens 8")
    assert "speculative_num_draft_tokens=8" in drafter_text(config)
    assert "speculative_ngram_match_type=PROB" in drafter_text(config)
    command = command_line(config, model="demo", prompt="x")
    assert "--drafter" in command and "# not expressible" not in command
    assert config_from_args(parse_args(shlex.split(command)[3:])) == config
    from engine.decoding.config import ConfigError

    with pytest.raises(ConfigError, match="is not a setting of sglang-ngram"):
        with_drafter(config, "prompt_lookup_min=2")
