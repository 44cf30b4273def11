"""scripts/learn_reads.py: which trees read a TR row the previous cycle's learning wrote (issue 71, item 3)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import DEMO_CURVE, script_module

from engine.core.tree import DraftTree, Source
from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.product.runs.decoder import make_decoder


@pytest.fixture(scope="module")
def learn_reads():
    return script_module("learn_reads")


@pytest.fixture(scope="module")
def two_cycles(demo_lm, lossless_prompts):
    """Two traces of a real run, whose trees the tests replace."""
    config = DecodeConfig().with_(max_new_tokens=8)
    decoder = make_decoder(demo_lm, config, demo_lm.eos_token_ids, cost_curve=CostCurve.from_spec(DEMO_CURVE))
    traces = list(decoder.generate(demo_lm.encode_prompt(lossless_prompts[0])))
    return traces[1], traces[2]


@pytest.mark.parametrize("now, reads", [
    ((7, 8), (True, True)),  # the anchor 7 was in the last tree
    ((9, 6, 3), (True, False)),  # 6 is expanded (it has a child) and was in the last tree
    ((9, 3, 6), (False, False)),  # 6 is a leaf: its row is not read
])
def test_a_tree_reads_the_rows_of_the_tokens_it_expands(learn_reads, two_cycles, now, reads):
    before, after = two_cycles
    before = replace(before, tree=DraftTree.chain([5, 6, 7], Source("pld")))
    after = replace(after, tree=DraftTree.chain(list(now), Source("pld")), candidates=None)
    assert learn_reads.reads_last_learning(before, after) == reads


def test_the_built_tree_before_gt_is_the_one_read(learn_reads, two_cycles):
    before, after = two_cycles
    before = replace(before, tree=DraftTree.chain([5, 6, 7], Source("pld")))
    after = replace(after, tree=DraftTree.root_only(9), candidates=DraftTree.chain([9, 5, 1], Source("tr")))
    assert learn_reads.reads_last_learning(before, after) == (True, False)
