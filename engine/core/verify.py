"""Tree verification: one forward of the stock HF model, then the walk that accepts a path.

Sources: Goose paper, Algorithm 3 (UNIFIEDGREEDYWALK) and Appendix B.3 for the greedy walk; PTD
paper Appendix B-C (candidate tree recursive sampling, as SpecInfer, Miao et al. 2024) for the
sampling walk; HSD (hierarchical speculative decoding, ICLR 2026: backward scan + capped branch
resampling) for sampled linear chains.  Tree attention as in SpecInfer / Medusa.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .topk_kernel import top_rows
from .tree import DraftTree, Source

#: A node's target distribution: node index -> (|V|,) float64 probabilities on the CPU (warped:
#: temperature, top-k, top-p), computed lazily so only the rows a walk visits are softmaxed.
Dist = Callable[[int], torch.Tensor]


@torch.no_grad()
def top_successors(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The TR adjacency table's score definition (``engine.sources.tr``): top-``k`` softmax probabilities of each
    row, on the logits' device (Goose Appendix C.1, aggressive logit harvesting).

    Args:
        logits: (n, |V|) logits (any dtype, any device).
        k: successors per row (capped at |V|).

    Returns:
        (scores, ids): (n, k) float32 probabilities, best first, and (n, k) int64 token ids.
    """
    scores, ids, _, _ = _top_rows(logits, k)
    return scores, ids


def _top_rows(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scores, ids, greedy, unsure) of each row: its top-``k`` softmax probabilities and their ids, (n, k)
    float32 and int64, best first; its argmax read off them, (n,) int64; and (n,) bool, whether that reading
    may be wrong (then ``greedy`` is not the argmax).

    Everything runs on fp32 logits (exact for bf16 / fp16 ones).  On a CPU torch's argmax of bf16 rows costs more
    than the top-k and the softmax together (docs/history.md, "Where the time goes"), so reading it off the top-k
    saves that pass; the top-k costs the same on fp32 rows.  The top-k is taken on the logits,
    whose order the softmax keeps (in fp32 two distinct logits may round to one probability; their logits still
    order them).  The argmax, as ``torch.argmax`` defines it (the lowest index among tied maxima), is the lowest
    id among the top-k entries equal to the row's maximum, unless all k equal it (the argmax may lie beyond
    them) or the maximum is NaN: those rows are ``unsure``.
    """
    x = logits.float()  # (n, |V|)
    vals, ids = x.topk(min(k, x.shape[-1]), dim=-1)  # (n, k), (n, k): sorted, so column 0 holds each row's maximum
    scores = torch.softmax(x, dim=-1).gather(-1, ids)  # (n, k) float32
    tied = vals == vals[:, :1]  # (n, k): entries equal to the maximum (all False when it is NaN)
    greedy = torch.where(tied, ids, x.shape[-1]).amin(dim=-1)  # (n,)
    return scores, ids, greedy, tied[:, -1] | ~tied[:, 0]


def _ordered_children(tree: DraftTree, node: int, priority: tuple[Source, ...]) -> list[int]:
    """Children of ``node`` in walk priority, then insertion order; sources outside it never walk."""
    kids = [c for c in tree.children[node] if tree.sources[c] in priority]
    return sorted(kids, key=lambda c: priority.index(tree.sources[c]))


@torch.no_grad()
def forward_tree(model, cache, tree: DraftTree, past_len: int) -> torch.Tensor:
    """Score every node of ``tree`` in one forward; the cache grows by ``len(tree)`` rows.

    The inputs are built on the model's device from the parent array (``DraftTree.device_inputs``):
    no host sync here, the forward is only enqueued on an accelerator.

    Args:
        model: a transformers causal LM.
        cache: its ``DynamicCache`` holding ``past_len`` committed positions.
        tree: n nodes; node 0 is the anchor (not yet in the cache).
        past_len: committed cache length.

    Returns:
        (n, |V|) logits, the model's dtype, on the model's (first) device; row i predicts the token after node i.
    """
    inputs = tree.device_inputs(past_len, model.dtype, model.device)
    out = model(
        input_ids=inputs.input_ids,  # (1, n)
        attention_mask=inputs.attention_mask,  # (1, 1, n, past + n)
        position_ids=inputs.position_ids,  # (1, n)
        cache=cache,
        use_cache=True,
    )
    return out.logits[0]  # (n, |V|)


@dataclass(frozen=True)
class ReadBack:
    """What the host needs from one verification forward, read back in one device-to-host copy.

    Attributes (one entry per forward row, PTD drafting rows included):
        greedy: (n,) the target's argmax token after each row.
        successor_ids, successor_scores: (n, k) int64 and float64 arrays, each row's top-k successors for the
            adjacency table (``top_successors``), as the table stores them (no Python objects); (n, 0) when ``k`` = 0
            (TR off).
        probs: sampling on an accelerator: (m, |V|) float32 warped target distributions of the first m rows (the
            tree's), on the host (``sampling.make_rows_warper``); None otherwise.
    """

    greedy: list[int]
    successor_ids: np.ndarray
    successor_scores: np.ndarray
    probs: torch.Tensor | None = None


@torch.no_grad()
def read_back(logits: torch.Tensor, k: int, probs: torch.Tensor | None = None) -> ReadBack:
    """Argmax and top-``k`` successors of every row, computed on the logits' device and copied to the host
    together: the cycle's single host sync (ids travel as float64, exact below 2^53).  A row whose top-k all tie
    for its maximum, or whose maximum is NaN, has its argmax read alone afterwards (a second sync, only then).

    With ``probs`` (sampling on an accelerator) the rows' distributions travel in the same copy: both tables
    are packed as raw bytes into one buffer (float64 ids and scores, then float32 probabilities), copied once,
    and viewed back in their own dtypes on the host, bit for bit.  CPU logits, where nothing is copied, are read
    with fewer tensor operations (``_read_back_here``): the same figures.

    Args:
        logits: (n, |V|) verification logits (any dtype, any device).
        k: successors per row for the adjacency table; 0 reads the argmax alone.
        probs: (m, |V|) float32 distributions on the logits' device, m <= n; None reads none.

    Returns:
        ``ReadBack``; its ``probs`` is ``probs`` on the host (float32), or None.
    """
    if probs is None and logits.device.type == "cpu":
        return _read_back_here(logits, k)
    return _read_back_packed(logits, k, probs)


def _read_back_packed(logits: torch.Tensor, k: int, probs: torch.Tensor | None) -> ReadBack:
    """``read_back`` on a device: every table packed into one buffer, one copy to the host."""
    if k:
        scores, ids, greedy, unsure = _top_rows(logits, k)  # (n, k), (n, k), (n,), (n,)
        k = ids.shape[-1]
        table = torch.cat([greedy[:, None].double(), unsure[:, None].double(), ids.double(), scores.double()],
                          dim=-1)  # (n, 2 + 2k)
    else:
        table = logits.float().argmax(dim=-1, keepdim=True).double()  # (n, 1); on a CPU fp32's argmax beats bf16's
    host_probs = None
    if probs is None:
        host = table.cpu().numpy()  # (n, 2 + 2k), or (n, 1) when k = 0: the one copy
    else:
        small = table.flatten().view(torch.uint8)  # (8 n (2 + 2k),) or (8 n,) bytes
        big = probs.to(torch.float32).contiguous().flatten().view(torch.uint8)  # (4 m |V|,) bytes
        both = torch.cat([small, big]).cpu()  # the one device->host copy
        host = both[: small.numel()].view(torch.float64).view(table.shape).numpy()
        host_probs = both[small.numel():].view(torch.float32).view(probs.shape)
    if not k:
        return ReadBack(host[:, 0].astype(np.int64).tolist(), *_no_successors(host.shape[0]), host_probs)
    rows = host[:, :2].tolist()
    greedy = [int(logits[i].float().argmax()) if r[1] else int(r[0]) for i, r in enumerate(rows)]  # a second sync
    # only for a row whose maximum recurs k times or is NaN
    return ReadBack(greedy, host[:, 2:2 + k].astype(np.int64), np.ascontiguousarray(host[:, 2 + k:]), host_probs)


def _no_successors(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, 0) int64 ids and float64 scores: a read-back of the argmax alone."""
    return np.zeros((n, 0), np.int64), np.zeros((n, 0), np.float64)


def _read_back_here(logits: torch.Tensor, k: int) -> ReadBack:
    """``read_back`` of CPU logits, where nothing is copied: each row's top-k ids and argmax (``_top_blocks``), their
    probabilities gathered from the softmax as ``_top_rows`` takes them (the same values); k = 0: the argmax alone.
    A few tensor operations instead of twenty: right after a llama.cpp decode has evicted the caches each one costs
    tens of µs, so the packing that saves a device's copies costs a CPU more than the work (docs/history.md, "Goose's
    cost per cycle").

    Args:
        logits: (n, |V|) CPU verification logits (any dtype).
        k: successors per row; 0 reads the argmax alone.
    """
    x = logits.float()  # (n, |V|)
    if not k:
        greedy = x.numpy().argmax(axis=-1).tolist()  # (n,): numpy's argmax, half torch's time (first maximum alike)
        return ReadBack(greedy, *_no_successors(len(greedy)))
    probs = torch.softmax(x, dim=-1)  # (n, |V|) float32
    ids, scores, greedy = _top_blocks(x, probs, min(k, x.shape[-1]))  # (n, k) int64, (n, k) float64, (n,)
    return ReadBack(greedy, ids, scores)


#: logits per block of ``_top_blocks``' first pass (a divisor of the common vocabulary sizes; others are padded)
TOP_BLOCK = 64


def warm_read_back() -> None:
    """Compile or load the CPU read-back's kernel (``topk_kernel``), waiting: about 1.3 s the first time on a 2-core
    CPU, then numba's cache.  A server does it before its first generation, so no read-back waits behind another
    thread's compile (numba compiles under one lock)."""
    read_back(torch.zeros(2, 2 * TOP_BLOCK), 2)


def _top_blocks(x: torch.Tensor, probs: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The ids of each row's ``k`` largest logits, by value, ties lowest id first ((n, k) int64), their probabilities
    ((n, k) float64: ``probs`` at those ids, as ``gather`` reads them) and each row's argmax (its first id: the lowest
    index among tied maxima, as ``torch.argmax`` defines it).

    Two passes instead of a top-k over every logit: the maximum of each block of ``TOP_BLOCK`` logits (torch's
    vectorised reduction), then ``topk_kernel.top_rows`` reads only the blocks that can hold a top-k logit, and
    gathers the probabilities in the same call.  In the loop, right after the forward (docs/results.md, "Goose's cost
    per cycle"), the read-back of one SmolLM2 row cost 0.20 ms against 0.24 with ``torch.topk``, of 2-8 demo rows
    0.12 against 0.14 (commit 9be7f69; the gather's move into the kernel took 0.02-0.03 ms more off).  A row
    holding a NaN (the largest, as ``torch.topk`` ranks it) is read by ``torch.topk`` and ``torch.argmax`` alone.

    Args:
        x: (n, |V|) float32 CPU logits.
        probs: (n, |V|) float32 their softmax.
        k: 1 <= k <= |V|.
    """
    n, vocab = x.shape
    x = x.contiguous()
    pad = -vocab % TOP_BLOCK
    if pad:  # padded with -inf: a padded entry ranks after every real one (highest id among equals)
        x = torch.cat([x, x.new_full((n, pad), float("-inf"))], dim=-1)
    nb = x.shape[1] // TOP_BLOCK
    top = x.view(n, nb, TOP_BLOCK).amax(dim=-1).numpy()  # (n, nb) float32: torch's reduction, vectorised
    ids, scores = np.empty((n, k), np.int64), np.empty((n, k), np.float64)  # (n, k), (n, k)
    p = probs.contiguous().numpy()  # (n, |V|) float32
    nan = top_rows(top, x.numpy().reshape(n, nb, TOP_BLOCK), p, ids, scores)  # (n,) bool
    greedy = ids[:, 0].tolist()
    for r in np.flatnonzero(nan).tolist():  # a NaN row: torch's ranking and argmax there
        ids[r], greedy[r] = x[r, :vocab].topk(k).indices.numpy(), int(x[r, :vocab].argmax())
        scores[r] = p[r, ids[r]]
    return ids, scores, greedy


def greedy_walk(tree: DraftTree, greedy: list[int], priority: tuple[Source, ...]) -> tuple[tuple[int, ...], int]:
    """Goose Algorithm 3: the longest path whose every token equals the target's greedy choice.

    At each node, children are tried in source priority (PLD spine before TR branch), then in
    insertion order; the first child whose token equals ``greedy[node]`` is accepted.

    Args:
        tree: the verified draft tree.
        greedy: (n,) argmax token of each node's logit row.
        priority: the order sources are tried in (``TreeShape.walk_priority``).

    Returns:
        (accepted node indices from the root's child down, root excluded; bonus token id), where the
        bonus token is the target's greedy token at the last accepted node.
    """
    node, accepted = 0, []
    children, tokens, sources = tree.children, tree.tokens, tree.sources
    while True:
        want = greedy[node]
        matches = [c for c in children[node] if tokens[c] == want and sources[c] in priority]
        if not matches:
            return tuple(accepted), want
        nxt = min(matches, key=lambda c: priority.index(sources[c])) if len(matches) > 1 else matches[0]
        accepted.append(nxt)  # the first in priority, then insertion order (``_ordered_children``'s order)
        node = nxt


def sample_walk(tree: DraftTree, dist: Dist, generator: torch.Generator,
                priority: tuple[Source, ...]) -> tuple[tuple[int, ...], int]:
    """Lossless tree verification for deterministic drafts (PTD Appendix B Alg. 2, proof in App. C).

    At each node, with P the node's target distribution: try the children in ``priority`` order;
    accept child c with probability P(c) / (remaining mass of P); on rejection set P(c) = 0 and go on
    (renormalising).  If no child is accepted the bonus token is sampled from what remains of P.
    For a deterministic draft this is SpecInfer's multi-round rejection sampling, so every committed
    token is distributed exactly as the target's (warped) distribution.

    Args:
        tree: the verified draft tree (children of a node carry distinct tokens).
        dist: node -> (|V|,) float64 target probabilities (see ``Dist``).
        generator: CPU ``torch.Generator`` (seeded by ``SamplerConfig.seed``).
        priority: the order sources are tried in.

    Returns:
        (accepted node indices, root excluded; bonus token id).
    """
    node, accepted = 0, []
    while True:
        p = dist(node).clone()  # (|V|,) float64
        nxt = None
        for c in _ordered_children(tree, node, priority):
            tok, mass = tree.tokens[c], float(p.sum())
            if p[tok] <= 0.0:
                continue
            if float(torch.rand((), generator=generator, dtype=torch.float64)) * mass < float(p[tok]):
                nxt = c
                break
            p[tok] = 0.0  # rejected: zero it, the rest is renormalised implicitly by ``mass``
        if nxt is None:
            return tuple(accepted), int(torch.multinomial(p / p.sum(), 1, generator=generator))
        accepted.append(nxt)
        node = nxt


def hsd_chain_walk(tree: DraftTree, dist: Dist, generator: torch.Generator,
                   draft_dist: Dist | None = None) -> tuple[tuple[int, ...], int]:
    """HSD verification of a linear chain: backward scan, then one capped branch resampling.

    Source: HSD (Overcoming Joint Intractability with Lossless Hierarchical Speculative Decoding,
    ICLR 2026), Algorithm 2: the capped prefix ratio
    w_t = min(1, w_{t-1} p(X_t) / q(X_t)) (r* of the paper), the hierarchical acceptance
    h_t = D_t / (D_t + 1 - w_t) with D_t = sum_x max(w_t p(x | X<=t) - q(x | X<=t), 0) for t < gamma and
    h_gamma = w_gamma, a backward scan from gamma for the last t with eta_t <= h_t (tau), and one
    resampling at tau + 1 from max(w_tau p(. | X<=tau) - q(. | X<=tau), 0).  (The same verifier as
    block verification, Sun et al. 2024.)

    Args:
        tree: a chain (node i is the i-th draft token, node 0 the anchor).
        dist: node -> (|V|,) float64 target probabilities p(. | X<=i).
        generator: CPU ``torch.Generator``.
        draft_dist: node -> q(. | X<=i), the drafter's distribution for the token after node i.
            Default (None): the drafter is deterministic (PLD copies its continuation), so q is the
            one-hot of the drafted token.  A q that is not the distribution the draft was really drawn
            from makes any verifier lossy, so soft PLD scores are *not* used as q.

    Returns:
        (accepted node indices; bonus token id).

    Raises:
        ValueError: ``tree`` is not a chain.
    """
    gamma = len(tree) - 1
    if any(tree.parents[i] != i - 1 for i in range(1, len(tree))):
        raise ValueError("HSD verifies linear chains only")
    q = _hsd_draft_dist(tree, dist, draft_dist)
    weights, h = _hsd_acceptance(tree, dist, q)
    eta = torch.rand(gamma + 1, generator=generator, dtype=torch.float64).tolist()
    tau = next((t for t in range(gamma, 0, -1) if eta[t] <= h[t]), 0)  # backward scan
    if tau == gamma:
        p = dist(gamma)
    else:
        p = torch.clamp(weights[tau] * dist(tau) - q(tau), min=0.0)  # capped branch resampling
        if float(p.sum()) <= 0.0:  # only by rounding (h_{tau+1} would have been 1): fall back to p
            p = dist(tau)
    return tuple(range(1, tau + 1)), int(torch.multinomial(p / p.sum(), 1, generator=generator))


def _hsd_draft_dist(tree: DraftTree, dist: Dist, draft_dist: Dist | None) -> Dist:
    """q(. | X<=i) of ``hsd_chain_walk``: ``draft_dist``, or (None) the one-hot of the drafted token after node i."""

    def q(i: int) -> torch.Tensor:  # (|V|,) drafter distribution of the token after node i
        if draft_dist is not None:
            return draft_dist(i)
        one_hot = torch.zeros_like(dist(i))
        one_hot[tree.tokens[i + 1]] = 1.0
        return one_hot

    return q


def _hsd_acceptance(tree: DraftTree, dist: Dist, q: Dist) -> tuple[list[float], list[float]]:
    """HSD Alg. 2's forward pass over a chain: the capped prefix ratios w_t (``weights``, w_0 = 1) and the
    hierarchical acceptances h_t (h_0 unused), t = 1 .. gamma."""
    gamma = len(tree) - 1
    w, weights, h = 1.0, [1.0], [1.0]  # w_0 = 1; h[0] unused
    for t in range(1, gamma + 1):
        tok = tree.tokens[t]
        q_tok = float(q(t - 1)[tok])
        w = min(1.0, w * float(dist(t - 1)[tok]) / q_tok) if q_tok > 0 else 0.0
        weights.append(w)
        if t < gamma:
            deficit = float(torch.clamp(w * dist(t) - q(t), min=0.0).sum())  # D_t: mass q lacks
            h.append(1.0 if w >= 1.0 else (deficit / (deficit + 1.0 - w) if deficit > 0 else 0.0))
        else:
            h.append(w)
    return weights, h
