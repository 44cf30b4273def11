"""Design probe for issue 71 (not the builder; run from the repository root, numba installed):
    python scripts/compiled_floor.py demo|smol

Floor of 'one compiled entry per cycle': a numba kernel doing a Goose cycle's host work over preallocated arrays
(store n rows in a unigram + bigram table, greedy walk, n-gram index insert + match, best-first build of B nodes
reading the table, GT prefix choice), called right after each real forward of the demo / SmolLM2 run, timed cold,
then again at once (warm).  Plus the cost of wrapping its output as a DraftTree (tolist + derived)."""
import sys
import time, pathlib, statistics, collections
sys.path.insert(0, "."); sys.path.insert(0, "tests")
import numpy as np
from numba import njit
from engine.decoding.config import DecodeConfig
from engine.decoding.cost import CostCurve
from engine.product.models.loading import load_model
from engine.product.runs.decoder import make_decoder
from engine.product.bench.prompts import load_prompts, encode
from engine.core.forward import make_path
from engine.core.tree import DraftTree, Source
from engine.decoding import decode
from conftest import DEMO_CURVE, SMOLLM2_CURVE

K, B, HCAP = 10, 32, 1 << 17

@njit(cache=True)
def _probe(keys, key):
    h = (key * 0x9E3779B97F4A7C15) & (keys.shape[0] - 1)
    while keys[h] != -1 and keys[h] != key:
        h = (h + 1) & (keys.shape[0] - 1)
    return h

@njit(cache=True)
def cycle(uni_ids, uni_sc, uni_len, bkeys, bslot, bi_ids, bi_sc, counters,
          ng_keys, ng_pos, hist, hist_len,
          p_tokens, p_parents, r_ids, r_sc, greedy, curve, lam,
          o_par, o_tok, o_src, o_sc, o_est, heap_s, heap_i, cand_par, cand_tok, cand_sc, cand_src):
    n = p_tokens.shape[0]
    # 1. walk (greedy): accepted path
    node = 0; acc = 0
    while True:
        nxt = -1
        for j in range(1, n):
            if p_parents[j] == node and p_tokens[j] == greedy[node]:
                nxt = j; break
        if nxt < 0: break
        node = nxt; acc += 1
    bonus = greedy[node]
    # 2. store the n rows (unigram + bigram)
    for i in range(n):
        t = p_tokens[i]
        for j in range(K):
            uni_ids[t, j] = r_ids[i, j]; uni_sc[t, j] = r_sc[i, j]
        uni_len[t] = K
        prev = p_tokens[p_parents[i]] if i > 0 else hist[hist_len[0] - 1]
        key = (prev << 32) | t
        h = _probe(bkeys, key)
        if bkeys[h] == -1:
            bkeys[h] = key; bslot[h] = counters[0] % bi_ids.shape[0]; counters[0] += 1
        s = bslot[h]
        for j in range(K):
            bi_ids[s, j] = r_ids[i, j]; bi_sc[s, j] = r_sc[i, j]
    # 3. commit acc + bonus tokens to the history, index their n-grams (3, 4, 5)
    L = hist_len[0]
    for a in range(acc + 1):
        hist[L] = bonus if a == acc else p_tokens[a + 1]
        L += 1
        for ng in (3, 4, 5):
            if L >= ng:
                key = ng
                for q in range(L - ng, L):
                    key = key * 1000003 + hist[q]
                h = _probe(ng_keys, key)
                if ng_keys[h] == -1:
                    ng_keys[h] = key; ng_pos[h] = L - 1
    hist_len[0] = L
    # 4. PLD match: longest n-gram of the suffix, its earliest continuation
    chain_start = -1
    for ng in (5, 4, 3):
        key = ng
        for q in range(L - ng, L):
            key = key * 1000003 + hist[q]
        h = _probe(ng_keys, key)
        if ng_keys[h] != -1 and ng_pos[h] < L - 1:
            chain_start = ng_pos[h] + 1; break
    # 5. best-first build: spine first, then TR branches by score
    m = 1
    o_par[0] = -1; o_tok[0] = bonus; o_src[0] = 0; o_sc[0] = 1.0; o_est[0] = 1.0
    if chain_start >= 0:
        for q in range(chain_start, min(L, chain_start + 12)):
            if m >= B // 2: break
            o_par[m] = m - 1; o_tok[m] = hist[q]; o_src[m] = 1; o_sc[m] = 0.8; o_est[m] = o_est[m - 1] * 0.8; m += 1
    hn = 0
    for v in range(m):  # candidates below every spine node
        t = o_tok[v]
        prev = o_tok[o_par[v]] if v > 0 else hist[L - 2]
        h = _probe(bkeys, (prev << 32) | t)
        if bkeys[h] != -1:
            s = bslot[h]; ids = bi_ids[s]; sc = bi_sc[s]
        else:
            ids = uni_ids[t]; sc = uni_sc[t]
        for j in range(uni_len[t] if uni_len[t] > 0 else 0):
            if hn < heap_s.shape[0]:
                heap_s[hn] = o_est[v] * sc[j]; heap_i[hn] = hn; cand_par[hn] = v; cand_tok[hn] = ids[j]; cand_sc[hn] = sc[j]; hn += 1
    while m < B and hn > 0:
        best = 0
        for c in range(1, hn):
            if heap_s[c] > heap_s[best]: best = c
        v = cand_par[best]
        o_par[m] = v; o_tok[m] = cand_tok[best]; o_src[m] = 2; o_sc[m] = cand_sc[best]; o_est[m] = heap_s[best]
        heap_s[best] = heap_s[hn - 1]; cand_par[best] = cand_par[hn - 1]; cand_tok[best] = cand_tok[hn - 1]; cand_sc[best] = cand_sc[hn - 1]
        hn -= 1
        t = o_tok[m]
        if uni_len[t] > 0:
            for j in range(3):
                if hn < heap_s.shape[0]:
                    heap_s[hn] = o_est[m] * uni_sc[t, j]; cand_par[hn] = m; cand_tok[hn] = uni_ids[t, j]; cand_sc[hn] = uni_sc[t, j]; hn += 1
        m += 1
    # 6. GT: top-n by estimate, value E - lam T(n)
    order = np.argsort(-o_est[1:m]) + 1
    best_n = 1; best_v = 1.0 - lam * curve[0]; e = 1.0
    for s in range(order.shape[0]):
        e += o_est[order[s]]
        val = e - lam * curve[s + 1]
        if val >= best_v: best_v = val; best_n = s + 2
    return acc, bonus, m, best_n

class State:
    def __init__(self, V):
        self.uni_ids = np.zeros((V, K), np.int64); self.uni_sc = np.zeros((V, K)); self.uni_len = np.zeros(V, np.int64)
        self.bkeys = np.full(HCAP, -1, np.int64); self.bslot = np.zeros(HCAP, np.int64)
        self.bi_ids = np.zeros((65536, K), np.int64); self.bi_sc = np.zeros((65536, K)); self.counters = np.zeros(4, np.int64)
        self.ng_keys = np.full(HCAP, -1, np.int64); self.ng_pos = np.zeros(HCAP, np.int64)
        self.hist = np.zeros(8192, np.int64); self.hist_len = np.array([1], np.int64)
        self.o = [np.zeros(64, np.int64), np.zeros(64, np.int64), np.zeros(64, np.int64), np.zeros(64), np.zeros(64)]
        self.heap = [np.zeros(512), np.zeros(512, np.int64), np.zeros(512, np.int64), np.zeros(512, np.int64), np.zeros(512), np.zeros(512, np.int64)]
        self.curve = np.linspace(5.0, 12.0, 128); self.lam = 0.3

def call(st, tokens, parents, r_ids, r_sc, greedy):
    o, hp = st.o, st.heap
    return cycle(st.uni_ids, st.uni_sc, st.uni_len, st.bkeys, st.bslot, st.bi_ids, st.bi_sc, st.counters,
                 st.ng_keys, st.ng_pos, st.hist, st.hist_len, tokens, parents, r_ids, r_sc, greedy, st.curve, st.lam,
                 o[0], o[1], o[2], o[3], o[4], hp[0], hp[1], hp[2], hp[3], hp[4], hp[5])

def wrap(st, m):  # the kernel's tree as a DraftTree (what the trace and the forward read)
    o = st.o
    par = o[0][:m].tolist(); par[0] = None
    return DraftTree.derived(tuple(o[1][:m].tolist()), tuple(par), tuple(Source.ROOT for _ in range(m)),
                             tuple(o[3][:m].tolist()), tuple(o[4][:m].tolist()))

which = sys.argv[1]
if which == "smol":
    from engine.product.models.named import SMOLLM2, ensure_gguf
    lm = load_model("smollm2", device="cpu", dtype="fp32"); curve = CostCurve.from_spec(SMOLLM2_CURVE)
    path = make_path(lm.model, "llamacpp", gguf=ensure_gguf(SMOLLM2))
else:
    lm = load_model("demo", device="cpu", dtype="bf16"); curve = CostCurve.from_spec(DEMO_CURVE)
    path = make_path(lm.model, "eager")
V = lm.model.config.vocab_size
cfg = DecodeConfig().with_(max_new_tokens=128)
ms = collections.defaultdict(list)
orig = decode.SpecDecoder._accept
st = State(V)
def accept(self, s, plan, logits, greedy, probs=None):
    tree = plan.grafted
    n = len(tree)
    t0 = time.perf_counter()
    tokens = np.asarray(tree.tokens, np.int64); parents = np.asarray((0, *tree.parents[1:]), np.int64)
    t1 = time.perf_counter()
    ms["to_arrays"].append((t1 - t0) * 1e3)
    r_ids, r_sc, g = st_rows[0][:n], st_rows[1][:n], st_rows[2][:n]  # synthetic rows: the work, not the values, matters
    t0 = time.perf_counter(); acc, bonus, m, bn = call(st, tokens, parents, r_ids, r_sc, g); t1 = time.perf_counter()
    tr = wrap(st, m); t2 = time.perf_counter()
    call(st, tokens, parents, r_ids, r_sc, g); t3 = time.perf_counter()
    ms["kernel cold"].append((t1 - t0) * 1e3); ms["wrap"].append((t2 - t1) * 1e3); ms["kernel warm"].append((t3 - t2) * 1e3)
    ms["nodes"].append(m)
    return orig(self, s, plan, logits, greedy, probs)
rng = np.random.default_rng(0)
st_rows = (rng.integers(0, V, (256, K)).astype(np.int64), rng.random((256, K)), rng.integers(0, V, 256).astype(np.int64))
# warm the JIT
call(st, np.array([1, 2, 3], np.int64), np.array([0, 0, 1], np.int64), st_rows[0][:3], st_rows[1][:3], st_rows[2][:3])
st = State(V)
decode.SpecDecoder._accept = accept
for ds in ("humaneval", "mbpp", "gsm8k", "mt_bench"):
    for text in load_prompts(pathlib.Path("assets/datasets"), ds, 3):
        ids = encode(lm, text, "chat" if lm.has_chat_template else "raw", 64)
        dec = make_decoder(lm.model, cfg, lm.eos_token_ids, cost_curve=curve, forward=path)
        for t in dec.generate(ids): pass
print(which, len(ms["wrap"]), " ".join(f"{k} {statistics.median(v):.4f}" for k, v in ms.items()))
