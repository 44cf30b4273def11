"""GPU-ready cycle: one device-to-host copy per greedy cycle, counted on the CPU.

On an accelerator every read of a tensor's values on the host (``tolist``, ``item``, ``bool``, ``int``,
``float``, ``cpu``, ``numpy``) waits for the device.  This test counts those calls per decoding cycle
outside the model's own forward; a count of 1 means the cycle enqueues its work and waits once, for
the read-back of the greedy tokens and the adjacency rows (``verify.read_back``).
"""
from __future__ import annotations

import pytest
import torch

from engine.config import DecodeConfig
from engine.decode import SpecDecoder

READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")
PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


class SyncCounter:
    """Counts host reads of tensor values, split into the model's forward and everything else."""

    def __init__(self) -> None:
        self.engine = 0
        self.model = 0
        self.in_model = False

    def wrap(self, method):
        def counted(tensor, *args, **kwargs):
            if self.in_model:
                self.model += 1
            else:
                self.engine += 1
            return method(tensor, *args, **kwargs)
        return counted


@pytest.fixture
def counter(monkeypatch, demo_lm):
    c = SyncCounter()
    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, c.wrap(getattr(torch.Tensor, name)))
    forward = demo_lm.model.forward

    def model_forward(*args, **kwargs):
        c.in_model = True
        try:
            return forward(*args, **kwargs)
        finally:
            c.in_model = False
    monkeypatch.setattr(demo_lm.model, "forward", model_forward)
    return c


@pytest.mark.parametrize("fields", [{}, {"gt_threshold": 0.0}, {"gt_threshold": "chord"}, {"method": "tr"},
                                    {"method": "pld"}, {"method": "iso3"}, {"sources": ("pld", "tr", "ptd")}],
                         ids=["auto", "c0", "chord", "tr", "pld", "iso3", "goose+ptd"])
def test_one_host_sync_per_greedy_cycle(demo_lm, counter, fields):
    decoder = SpecDecoder(demo_lm.model, DecodeConfig(max_new_tokens=48, **fields), ())
    cycles = decoder.generate(demo_lm.encode_prompt(PROMPT))
    next(cycles)  # prefill: not a cycle
    per_cycle = []
    while True:
        counter.engine = 0
        trace = next(cycles, None)
        if trace is None:
            break
        per_cycle.append(counter.engine)
    assert len(per_cycle) >= 3 and per_cycle == [1] * len(per_cycle), per_cycle


def test_the_tree_forward_itself_reads_nothing_back(demo_lm, counter):
    """transformers' forward with our 4D mask and position ids: no host read inside it either."""
    traces = list(SpecDecoder(demo_lm.model, DecodeConfig(max_new_tokens=24, gt_threshold=0.0), ()).generate(
        demo_lm.encode_prompt(PROMPT)))
    assert any(len(t.tree) > 1 for t in traces) and counter.model == 0


@pytest.mark.parametrize("seed", range(12))
def test_device_inputs_match_the_parent_array(seed):
    """Mask and positions built by pointer doubling equal the host ancestor relation, deep chains included."""
    import random

    from engine.tree import DraftTree, Source

    rng = random.Random(seed)
    n = rng.choice([1, 2, 7, 60, 130])
    chain = seed % 3 == 0  # bypass chains of up to 129 tokens: depth = n - 1
    parents = (None, *((i - 1) if chain else rng.randrange(i) for i in range(1, n)))
    tree = DraftTree(tuple(range(n)), parents, (Source.ROOT,) + (Source.TR,) * (n - 1), (1.0,) * n, (1.0,) * n)
    past = rng.choice([0, 5, 300])
    inputs = tree.device_inputs(past, torch.float32, "cpu")
    assert inputs.input_ids.tolist() == [list(tree.tokens)]
    assert inputs.position_ids.tolist() == [[past + d for d in tree.depths]]
    allowed = inputs.attention_mask[0, 0] == 0  # (n, past + n)
    assert allowed[:, :past].all()
    assert (allowed[:, past:].numpy() == tree.ancestor_matrix).all()
