"""GPU-ready cycle: one device-to-host copy per cycle, greedy and sampling, counted on the CPU.

On an accelerator every read of a tensor's values on the host (``tolist``, ``item``, ``bool``, ``int``,
``float``, ``cpu``, ``numpy``) waits for the device.  Greedy: these calls are counted per decoding cycle
outside the model's own forward; a count of 1 means the cycle enqueues its work and waits once, for
the read-back of the greedy tokens and the adjacency rows (``verify.read_back``).  Sampling walks host
tensors (its random draws), so there only reads of what would live on the device are counted: the model's
logits and every tensor computed from them (``OnDevice``); the inputs and the cache are the greedy cycle's.
Host-to-device uploads: on a CPU nothing is pinned (``transfer.upload``).  On a real GPU, tests/test_cuda.py.
"""
from __future__ import annotations

import pytest
import torch

from engine.core import verify
from engine.decoding.config import DecodeConfig
from engine.decoding.sampling import make_rows_warper
from engine.product.runs.decoder import make_decoder

READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")
PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


class SyncCounter:
    """Counts host reads of tensor values, split into the model's forward and everything else.  The numpy view of a
    tensor ``cpu()`` just returned is the same read, not a second one (``read_back``'s one copy, as arrays)."""

    def __init__(self) -> None:
        self.engine = 0
        self.model = 0
        self.in_model = False
        self.copied: dict[int, torch.Tensor] = {}  # the tensors ``cpu()`` returned (kept: their ids stay theirs)

    def wrap(self, name: str, method):
        def counted(tensor, *args, **kwargs):
            if name == "numpy" and self.copied.get(id(tensor)) is tensor:
                return method(tensor, *args, **kwargs)
            if self.in_model:
                self.model += 1
            else:
                self.engine += 1
            out = method(tensor, *args, **kwargs)
            if name == "cpu":
                self.copied[id(out)] = out
            return out
        return counted


@pytest.fixture
def counter(monkeypatch, demo_lm):
    """Counts host reads; the read-back is the accelerator's (one packed copy): the CPU's own shortcut, which reads
    three small tables where nothing is copied (``verify._read_back_here``), is routed to it."""
    monkeypatch.setattr(verify, "_read_back_here", lambda logits, k: verify._read_back_packed(logits, k, None))
    c = SyncCounter()
    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, c.wrap(name, getattr(torch.Tensor, name)))
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
@pytest.mark.full  # several seconds of decoding (the quick tier keeps what issue 32 names and the sub-second tests)
def test_one_host_sync_per_greedy_cycle(demo_lm, counter, fields):
    decoder = make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=48, **fields), ())
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
    traces = list(make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=24, gt_threshold=0.0), ()).generate(
        demo_lm.encode_prompt(PROMPT)))
    assert any(len(t.tree) > 1 for t in traces) and counter.model == 0


@pytest.mark.parametrize("seed", range(12))
def test_device_inputs_match_the_parent_array(seed):
    """Mask and positions built by pointer doubling equal the host ancestor relation, deep chains included."""
    import random

    from engine.core.tree import DraftTree, Source

    rng = random.Random(seed)
    n = rng.choice([1, 2, 7, 60, 130])
    chain = seed % 3 == 0  # bypass chains of up to 129 tokens: depth = n - 1
    parents = (None, *((i - 1) if chain else rng.randrange(i) for i in range(1, n)))
    tree = DraftTree(tuple(range(n)), parents, (Source.ROOT,) + (Source("tr"),) * (n - 1), (1.0,) * n, (1.0,) * n)
    past = rng.choice([0, 5, 300])
    inputs = tree.device_inputs(past, torch.float32, "cpu")
    assert inputs.input_ids.tolist() == [list(tree.tokens)]
    assert inputs.position_ids.tolist() == [[past + d for d in tree.depths]]
    allowed = inputs.attention_mask[0, 0] == 0  # (n, past + n)
    assert allowed[:, :past].all()
    assert (allowed[:, past:].numpy() == tree.ancestor_matrix).all()


class OnDevice(torch.Tensor):
    """What would live on an accelerator: the model's logits and every tensor computed from them (a subclass that
    every torch op passes on).  Reading one's values on the host counts as a device read in ``reads`` (a list,
    one entry per read); ``.cpu()`` / ``.to("cpu")`` is the copy itself: counted, and its result is a plain host
    tensor that is free to read."""

    reads: list = []  # replaced per test by the fixture

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        to_host = func is torch.Tensor.cpu or (func is torch.Tensor.to and _device_of(args, kwargs) == "cpu")
        if to_host or getattr(func, "__name__", "") in READS:
            cls.reads.append(getattr(func, "__name__", str(func)))
        out = super().__torch_function__(func, types, args, kwargs)
        return out.as_subclass(torch.Tensor) if to_host else out


def _device_of(args, kwargs) -> str | None:
    """The device type ``Tensor.to(*args, **kwargs)`` moves to (None: it keeps the device)."""
    device = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
    return device.type if device is not None else None


@pytest.fixture
def device_reads(monkeypatch, demo_lm):
    """Marks the model's logits ``OnDevice``; yields the list their host reads are appended to."""
    reads: list = []
    monkeypatch.setattr(OnDevice, "reads", reads)
    forward = demo_lm.model.forward

    def marked(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = out.logits.as_subclass(OnDevice)
        return out
    monkeypatch.setattr(demo_lm.model, "forward", marked)
    return reads


@pytest.mark.parametrize("fields", [{"temperature": 0.8}, {"temperature": 1.0, "top_p": 0.9, "sample_top_k": 20},
                                    {"temperature": 0.7, "method": "pld", "verifier": "hsd"},
                                    {"temperature": 0.9, "sources": ("pld", "tr", "ptd")}],
                         ids=["tree", "top-p-top-k", "hsd-chain", "goose+ptd"])
@pytest.mark.full  # several seconds of decoding (the quick tier keeps what issue 32 names and the sub-second tests)
def test_one_device_read_per_sampling_cycle(demo_lm, device_reads, fields):
    """The accelerator's sampling path (``SpecDecoder.warp_rows``, forced here on the CPU): the tree rows'
    distributions come back in the cycle's one read-back, and the walk reads only host tensors.  It samples
    exactly what the CPU's path (the rows the walk visits, warped one by one) samples: the same tokens."""
    config = DecodeConfig.of(max_new_tokens=48, seed=5, **fields)
    ids = demo_lm.encode_prompt(PROMPT)
    lazy = [t for tr in make_decoder(demo_lm.model, config, ()).generate(ids) for t in tr.new_tokens]
    decoder = make_decoder(demo_lm.model, config, ())
    assert decoder.warp_rows is None  # a CPU warps lazily: nothing is copied there
    decoder.warp_rows = make_rows_warper(config)
    cycles = decoder.generate(ids)
    out = list(next(cycles).new_tokens)  # prefill: not a cycle
    per_cycle, drafted = [], 0
    while True:
        device_reads.clear()
        trace = next(cycles, None)
        if trace is None:
            break
        per_cycle.append(list(device_reads))
        out += trace.new_tokens
        drafted += len(trace.accepted)
    assert len(per_cycle) >= 3 and all(r == ["cpu"] for r in per_cycle), per_cycle
    assert drafted > 0, "no draft accepted: inconclusive"
    assert out == lazy


def test_uploads_on_a_cpu_pin_nothing(demo_lm, monkeypatch):
    """``transfer.upload`` on a CPU is ``torch.tensor`` itself: a greedy run never pins memory."""
    from engine.core.transfer import upload

    def refuse(*args, **kwargs):
        raise AssertionError("pinned memory on a CPU")
    monkeypatch.setattr(torch.Tensor, "pin_memory", refuse)
    traces = list(make_decoder(demo_lm.model, DecodeConfig.of(max_new_tokens=24, gt_threshold=0.0), ()).generate(
        demo_lm.encode_prompt(PROMPT)))
    assert any(len(t.tree) > 2 for t in traces)
    assert upload([[1, 2], [3, 4]], torch.long, "cpu").tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_read_back_reads_what_the_accelerators_reads(dtype):
    """``read_back`` on CPU logits (``_read_back_here``: the two-pass top-k of ``_top_blocks``, and the softmax
    gathered) against the packed path an accelerator takes (one copy, ``torch.topk``): the same argmax, and the same
    successors and scores, ties, all-tied rows, -inf and NaNs included.  Tied logits a top-k may rank either way: the
    two-pass ranks them lowest id first (a stable sort's order, checked), and where a row's k-th value ties the next,
    the two reads may keep different ids."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(60):
        n, vocab = 1 + trial % 6, (50, 8192, 50257)[trial % 3]
        x = torch.randn(n, vocab, generator=gen) * 3
        if trial % 3 == 0:
            x = x.round()  # many ties, at the maximum too
        if trial % 7 == 0:
            x[0] = 1.0  # every logit tied: the argmax lies beyond the top-k
        if trial % 5 == 0:
            x[0, : vocab // 2] = float("-inf")  # a masked half
        if trial % 11 == 0:
            x[-1, 3] = float("nan")
        x = x.to(dtype)
        for k in (0, 10):
            here, packed = verify.read_back(x, k), verify._read_back_packed(x, k, None)
            assert here.greedy == packed.greedy == x.float().argmax(dim=-1).tolist()
            if not k:
                continue
            ranked = x.float().sort(dim=-1, descending=True, stable=True)  # value, then lowest id first
            for r in range(n):
                if x[r].isnan().any():
                    assert here.successor_ids[r].tolist() == packed.successor_ids[r].tolist()  # torch.topk's there
                    continue
                assert here.successor_ids[r].tolist() == ranked.indices[r, :k].tolist()
                if ranked.values[r, k - 1] > ranked.values[r, k]:  # the top-k a set apart: the same pairs
                    assert sorted(zip(here.successor_ids[r].tolist(), here.successor_scores[r].tolist())) == sorted(
                        zip(packed.successor_ids[r].tolist(), packed.successor_scores[r].tolist()))
