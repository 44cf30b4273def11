"""Draft sources: the PLD context matcher, the TR adjacency table, PTD's pool, the suffix tries, the protocol."""
from __future__ import annotations

import pytest
import torch

from engine.core.tree import Source
from engine.decoding.config import WALK_PRIORITY
from engine.sources.pld import NgramIndex, match_confidence
from engine.sources.tr import AdjacencyTable

PRIORITY = tuple(Source(name) for name in WALK_PRIORITY)  # the walk's default order (Goose Alg. 3)


def test_no_match_on_fresh_text():
    idx = NgramIndex()
    idx.extend([1, 2, 3, 4, 5])
    m = idx.match(10)
    assert m.draft == () and m.n == 0 and not m.consensus


def test_longest_n_first_and_most_recent_occurrence():
    idx = NgramIndex((5, 4, 3), occurrence="latest")
    # '1 2 3' occurs twice before the end with different continuations; the most recent wins
    idx.extend([1, 2, 3, 7, 8, 0, 1, 2, 3, 9, 9, 0, 1, 2, 3])
    m = idx.match(4)
    assert m.n == 4  # '0 1 2 3' matches, longer than 3
    assert m.draft == (9, 9, 0, 1)


def test_earliest_occurrence_copies_the_longest_continuation():
    # the authors' rule: the first occurrence of '1 2 3' is followed by the whole rest of the stream
    tokens = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3]
    earliest, latest = NgramIndex((3,), "earliest"), NgramIndex((3,), "latest")
    earliest.extend(tokens)
    latest.extend(tokens)
    assert earliest.match(20).draft == (4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3)
    assert latest.match(20).draft == (4, 5, 6, 1, 2, 3)
    with pytest.raises(ValueError, match="occurrence"):
        NgramIndex((3,), "random")


def test_unanimous_needs_two_earlier_occurrences_that_agree():
    idx = NgramIndex((3,))
    idx.extend([1, 2, 3, 7, 1, 2, 3])
    assert not idx.match(5).unanimous  # one earlier occurrence agrees with itself: no evidence
    idx.extend([7, 1, 2, 3])
    assert idx.match(5).unanimous  # two earlier occurrences, both continue with 7
    idx.extend([8, 1, 2, 3])
    assert not idx.match(5).unanimous  # 7, 7, 8: not unanimous


def test_match_confidence_schedule():
    assert match_confidence(0, True) == 0.0  # no match, no confidence
    assert match_confidence(3, True) == 1.0  # unanimous saturates
    assert match_confidence(4, False, long_match=8) == pytest.approx(0.3)  # short: linear up to 0.6
    assert match_confidence(8, False, long_match=8, max_len=20) == pytest.approx(0.7)  # long: 0.7 ...
    assert match_confidence(20, False, long_match=8, max_len=20) == pytest.approx(0.9)  # ... to 0.9
    assert match_confidence(7, False, long_match=8) < 0.6 < match_confidence(8, False, long_match=8)


def test_match_of_a_suffix_past_the_sequence_copies_indexed_tokens_only():
    idx = NgramIndex((3,))
    idx.extend([1, 2, 3, 4, 5, 6, 7, 0])
    assert idx.match(3, suffix=[9, 4, 5, 6]).draft == (7, 0)  # '4 5 6' found; continuation from the index
    assert idx.match(3, suffix=[6, 7, 0]).draft == ()  # only at the very end: nothing after it to copy


def _pld_over(tokens: list[int], chain_tokens: int):
    """A PLD source whose chains are ``chain_tokens`` long, and the first chain it proposes after ``tokens``."""
    from engine.core.estimates import AcceptanceStats
    from engine.decoding.config import DecodeConfig
    from engine.sources import Request, SourceMemory
    from engine.sources.pld import PldSource

    pld = PldSource(DecodeConfig.of(ngram_sizes=(3,), match_occurrence="earliest", max_spine=chain_tokens),
                    AcceptanceStats(), SourceMemory())
    return pld, pld.propose(Request(tokens, (), budget=100))


def test_extend_chain_grows_by_rematching_up_to_the_limit():
    from engine.sources.base import extend_chain

    period = list(range(10, 22))  # a 12-token passage repeated: every lookup continues it
    context = period * 3 + period[:3]
    pld, first = _pld_over(context, 5)
    assert first.tokens == tuple(period[3:8])
    chain = extend_chain(pld, context, first, limit=30, budget=100, saturated=False)
    assert len(chain) == 30 and list(chain.tokens) == (period * 4)[3:33]  # 5 + 5 lookups of 5 tokens
    assert len(chain.p) == 30 and chain.match == first.match
    assert extend_chain(pld, context, first, limit=5, budget=100, saturated=False).tokens == first.tokens


def test_saturated_extension_stops_after_the_first_lookup_that_is_not_unanimous():
    from engine.sources.base import extend_chain

    # '1 2 3' is followed by 4 twice (unanimous); '4 5 6' once before (not unanimous)
    context = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 4, 8, 8, 1, 2, 3]
    pld, first = _pld_over(context, 2)
    assert first.tokens == (4, 5) and first.confidence == 1.0
    chain = extend_chain(pld, context, first, limit=50, budget=100, saturated=True)
    assert chain.tokens == (4, 5, 6, 9)  # the lookup after '3 4 5' is not unanimous: appended, then growth stops
    grown = extend_chain(pld, context, first, limit=50, budget=100, saturated=False)
    assert len(grown) > len(chain)


def test_consensus_when_two_n_agree_on_first_token():
    idx = NgramIndex((5, 4, 3))
    idx.extend([5, 1, 2, 3, 4, 6, 7, 1, 2, 3, 4])
    m = idx.match(8)
    assert m.draft[0] == 6 and m.consensus  # n=4 and n=3 both continue with 6


def test_no_consensus_when_lengths_disagree():
    idx = NgramIndex((4, 3), occurrence="latest")
    idx.extend([9, 2, 3, 4, 5, 8, 2, 3, 4, 6, 1, 9, 2, 3, 4])
    m = idx.match(3)
    assert m.n == 4 and m.draft == (5, 8, 2)
    assert not m.consensus  # n=3's most recent occurrence continues with 6


def test_index_is_incremental():
    idx = NgramIndex((3,))
    idx.extend([1, 2, 3])
    idx.extend([4, 1, 2])
    idx.extend([3])
    assert idx.match(5).draft == (4, 1, 2, 3)
    assert len(idx._positions[3][(1, 2, 3)]) == 2


def test_match_is_capped_at_max_len():
    idx = NgramIndex((3,))
    idx.extend([1, 2, 3] + list(range(10, 40)) + [1, 2, 3])
    assert len(idx.match(20).draft) == 20


def test_harvest_fills_unigram_and_bigram_tiers():
    table = AdjacencyTable(vocab_size=16, top_k=3)
    logits = torch.full((2, 16), -10.0)
    logits[0, 5], logits[0, 6], logits[0, 7] = 5.0, 4.0, 3.0
    logits[1, 9] = 8.0
    table.harvest([None, 4], torch.tensor([2, 3]), logits)
    succ = table.successors(None, 2)
    assert [t for t, _ in succ] == [5, 6, 7]
    assert succ[0][1] > succ[1][1] > succ[2][1] and abs(sum(s for _, s in succ) - 1) < 0.01
    assert table.successors(4, 3)[0][0] == 9  # bigram tier
    assert table.successors(1, 3)[0][0] == 9  # unseen bigram -> unigram row
    assert table.successors(None, 11) == []  # never observed
    assert [t for t, _ in table.successors(None, 2, min_score=0.2)] == [5, 6]


def test_harvest_overwrites_with_latest_and_bigram_capacity_is_bounded():
    table = AdjacencyTable(vocab_size=8, top_k=2, bigram_capacity=3)
    for prev in range(6):
        logits = torch.zeros(1, 8)
        logits[0, prev] = 10.0
        table.harvest([prev], torch.tensor([1]), logits)
    assert table.successors(None, 1)[0][0] == 5
    assert len(table.bigram) == 3 and (5, 1) in table.bigram and (0, 1) not in table.bigram


# -- PTD (progressive tree drafting, PTD paper §3.2) -----------------------------------------------

def test_ptd_pool_merge_is_recursive_and_bounded():
    from engine.sources.ptd import CandidatePool

    pool = CandidatePool(width=2, max_depth=3)
    pool.merge(5, [[1, 2], [1, 3]])
    pool.merge(5, [[1, 2, 4], [7]])  # shared prefix 1 -> 2 merges; 7 is new
    trie = pool.get(5)
    assert list(trie.children) == [1, 7] and set(trie.children[1].children) == {2, 3}
    assert list(trie.children[1].children[2].children) == [4]
    pool.merge(5, [[9]])  # width 2: the least recently merged child (1) is evicted
    assert list(pool.get(5).children) == [7, 9]
    pool.merge(6, [[1, 2, 3, 4, 5]])
    assert pool.get(6).size() == 3  # depth capped at 3
    assert pool.get(99) is None


def test_ptd_tree_grows_steps_and_feeds_the_pool():
    from engine.sources.ptd import CandidatePool, ProgressiveTree

    tree = ProgressiveTree([10, 11, 12], width=2, max_depth=4, max_rows=100, init_width=1, seed=0)  # root depth 1
    pool = CandidatePool()
    assert len(tree) == 2 and tree.parents == [None, 0]
    tree.grow([20, 21], pool)  # each row gets its greedy token as a child
    assert len(tree) == 4 and tree.tokens[2:] == [20, 21] and tree.parents[2:] == [0, 1]
    assert pool.get(tree.tokens[0]) is not None and 21 in pool.get(tree.tokens[1]).children
    tree.grow([20, 21, 30, 31], pool)  # 20, 21 already children: only rows 2, 3 grow
    assert len(tree) == 6
    first_child_token = tree.tokens[1]
    tree.grow([40] * 6, pool)  # depth 5 > 4: step to the root's earliest child's subtree
    assert tree.tokens[0] == first_child_token and tree.parents[0] is None and max(tree.depths()) <= 4
    assert all(p is None or p < i for i, p in enumerate(tree.parents))


def test_ptd_rows_ride_along_under_the_anchor():
    from engine.core.tree import DraftTree, Source

    tree = DraftTree((7, 8), (None, 0), (Source.ROOT, Source("pld")), (1.0, 0.5), (1.0, 0.5))
    full = tree.graft([3, 4, 5], [None, 0, 1], Source("ptd-row"))
    assert full.parents == (None, 0, 0, 2, 3) and full.depths == (0, 1, 1, 2, 3)
    assert full.ancestor_matrix[4].tolist() == [True, False, True, True, True]  # not the PLD node
    from engine.core.verify import greedy_walk

    assert greedy_walk(full, [3, 0, 4, 5, 0], PRIORITY) == ((), 3)  # drafting rows are never accepted


# -- suffix source (SuffixDecoding) -----------------------------------------------------------------


def test_suffix_trie_counts_every_substring_up_to_its_depth_and_removes_them_again():
    from engine.sources.suffix import SuffixTrie

    trie = SuffixTrie(depth=3)
    trie.start()
    trie.append([1, 2, 1, 2, 3])
    assert trie.find([1, 2])[0] == 2 and trie.find([2, 1])[0] == 1 and trie.find([1, 2, 3])[0] == 1
    assert trie.find([1, 2, 1, 2]) is None  # longer than the depth
    trie.start()
    trie.append([2, 3])  # a second sequence: no substring spans the two
    assert trie.find([2, 3])[0] == 2 and trie.find([3, 2]) is None
    trie.remove([1, 2, 1, 2, 3])
    assert trie.find([1]) is None and trie.find([2, 3])[0] == 1


def test_suffix_match_and_speculation_adapt_to_the_match_length():
    from engine.sources.suffix import SuffixTrie, speculate

    trie = SuffixTrie(depth=8)
    trie.start()
    trie.append([5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 11])
    m, node = trie.longest_match([0, 6, 7, 8])  # "6 7 8" occurs, "0 6 7 8" does not
    assert m == 3 and node[0] == 2
    spec = speculate(node, room=8 - m, limit=3, min_prob=0.1, match=m)
    assert spec.tokens == (9, 10, 11) and spec.parents == (None, 0, 0) and spec.p == (1.0, 0.5, 0.5)
    assert spec.match == 3 and spec.main_path == (0, 1)
    assert speculate(node, room=8 - m, limit=3, min_prob=0.6, match=m).tokens == (9,)  # halves below min_prob
    assert speculate(node, room=1, limit=9, min_prob=0.0, match=m).tokens == (9,)  # the trie's depth bounds it


def test_suffix_memory_is_bounded_and_keeps_finished_outputs():
    from engine.sources.suffix import SuffixMemory

    memory = SuffixMemory(depth=4, max_tokens=6)
    memory.add([1, 2, 3, 4])
    assert memory.trie.find([1, 2, 3, 4])[0] == 1
    memory.add([7, 8, 9])  # 4 + 3 tokens > 6: the oldest output goes
    assert memory.tokens == 3 and memory.trie.find([1]) is None and memory.trie.find([7, 8])[0] == 1
    assert memory.speculate([0, 7], lambda m: 5, 0.0).tokens == (8, 9)


def test_request_tail_reads_context_then_path():
    from engine.sources import Request

    assert Request([1, 2, 3], (9,)).tail(5) == [1, 2, 3, 9]
    assert Request(list(range(15))).tail(23) == list(range(15))
    assert Request([1, 2, 3], (7, 8, 9)).tail(2) == [8, 9]


def test_sources_follow_one_protocol_and_the_registry_names_them():
    from engine.core.estimates import AcceptanceStats
    from engine.core.tree import Source
    from engine.decoding.config import SOURCES, DecodeConfig
    from engine.sources import REGISTRY, SourceMemory, make_sources

    assert tuple(i.name for i in REGISTRY) == SOURCES
    made = make_sources(DecodeConfig.of(sources=SOURCES), AcceptanceStats(), SourceMemory())
    assert [s.info for s in made] == list(REGISTRY)
    for src in made:
        assert {"prefill", "propose", "observe"} <= set(dir(src)) and isinstance(src.top_k, int)
        assert isinstance(src.info.source, Source)


def test_a_source_declares_its_tag_settings_and_method_in_its_module():
    """Issue 20: the core names no source: each tag, its spine-ness, its settings and its method come from the
    source's module through the registry, and the walk's default order derives from the roles."""
    from dataclasses import fields

    from engine.decoding.config import FLAT_NAMES, METHODS, DecodeConfig
    from engine.sources import REGISTRY, SOURCE_TYPES, Role

    for t in SOURCE_TYPES:
        info = t.info
        assert Source(info.name) is info.source and info.source.spine == (info.role is Role.SPINE)
        assert info.name in METHODS and info.source.verified
        own = DecodeConfig().source_config(info.name)
        assert type(own) is t.config_type and t.__module__ == t.config_type.__module__
        assert {t.config_type.FLAT.get(f.name, f.name) for f in fields(t.config_type)} <= set(FLAT_NAMES)
    assert [Source(n).spine for n in WALK_PRIORITY] == sorted((Source(n).spine for n in WALK_PRIORITY), reverse=True)
    assert set(WALK_PRIORITY) == {i.name for i in REGISTRY}
    assert not Source("ptd-row").verified and not Source.ROOT.verified
    with pytest.raises(ValueError, match="not a node tag"):
        Source("eagle")
