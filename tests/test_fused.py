"""The fused paths (engine/core/forward/fused.py, issue 72 item 1): the decoder step with concatenated q/k/v and
gate/up projections gives the static path's logits (fp32, the demo model and a GQA model with q/k/v biases), its
generations are lossless, and a model it cannot compute says why.  Its CUDA form (graphed-fused) is checked by
scripts/gpu_check.py on a GPU, which counts its kernels beside the graphed path's."""
from __future__ import annotations

import pytest
import torch
from conftest import greedy_reference

from engine.core.forward import StaticPath, make_path
from engine.core.forward.fused import FusedDecoder, FusedPath, agreement_problem, fused_problem
from engine.core.tree import DraftTree, Source
from engine.decoding.config import DecodeConfig
from engine.product.runs.decoder import make_decoder

TR = Source("tr")
#  0(root)  1  2  3  4  5  6: two branches under the root, a chain of 3 under node 3
TREE = DraftTree((7, 8, 9, 10, 11, 12, 13), (None, 0, 0, 0, 3, 2, 4), (Source.ROOT,) + (TR,) * 6, (1.0,) * 7,
                 (1.0,) * 7)


def _tiny(kind: str, **extra):
    """A two-layer model of transformers' ``kind`` from its config, fp32, seeded."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(kind, vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **extra)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _same_logits(model, tol: float) -> None:
    """The fused and static paths over one prompt, a branching tree, a commit off the first rows, a second tree."""
    fused, static = FusedPath(model).open(96, 8), StaticPath(model).open(96, 8)
    prompt = list(range(3, 40))
    torch.testing.assert_close(fused.prefill(prompt), static.prefill(prompt))  # both: the model's own prefill
    torch.testing.assert_close(fused.verify(TREE), static.verify(TREE), atol=tol, rtol=0)
    fused.commit([0, 3, 4])
    static.commit([0, 3, 4])
    second = DraftTree.chain([20, 21, 22], TR)
    torch.testing.assert_close(fused.verify(second), static.verify(second), atol=tol, rtol=0)


def test_the_fused_step_gives_the_static_paths_logits_on_the_demo_model(demo_lm):
    _same_logits(demo_lm.model, 1e-5)


def test_a_gqa_model_with_qkv_biases_is_fused_too():
    """Qwen2's layout: two kv heads for four query heads (SDPA's grouped attention), biases on q, k and v."""
    model = _tiny("qwen2")
    assert model.model.layers[0].self_attn.q_proj.bias is not None and fused_problem(model) is None
    _same_logits(model, 1e-5)


@pytest.mark.parametrize("method", ["goose", "ar"])
def test_the_fused_path_is_lossless_in_fp32(demo_lm, method):
    prompt = demo_lm.encode_prompt("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                                   chat=False)
    config = DecodeConfig(method=method, max_new_tokens=48)
    traces = list(make_decoder(demo_lm.model, config, (), forward=make_path(demo_lm.model, "fused")).generate(prompt))
    assert [t for c in traces for t in c.new_tokens] == greedy_reference(demo_lm.model, prompt, 48)
    assert method == "ar" or sum(len(c.accepted) for c in traces) > 0, "inconclusive: no draft token was accepted"


def test_a_model_the_fused_step_cannot_compute_says_why():
    """Qwen3's q/k norms are parts Llama's layer has not; a step whose weights differ from the model's is caught by
    the agreement check; a packed linear (the bf16 CPU kernels) is no plain one."""
    qwen3 = _tiny("qwen3", head_dim=32)
    assert "beyond or instead of Llama's parts" in fused_problem(qwen3)
    with pytest.raises(ValueError, match="the fused paths cannot serve this model"):
        FusedPath(qwen3)
    llama = _tiny("llama")
    step = FusedDecoder(llama)
    assert agreement_problem(llama, step) is None
    with torch.no_grad():
        step.layers[1].gate_up.mul_(1.5)
    assert "compute other logits than Llama's" in agreement_problem(llama, step)
    attn = llama.model.layers[0].self_attn
    attn.q_proj.bias = torch.nn.Parameter(torch.zeros(attn.q_proj.out_features))  # q biased, k and v not
    assert "do not all carry a bias" in fused_problem(llama)
    attn.q_proj.bias = None
    llama.model.layers[0].mlp.up_proj = torch.nn.Identity()  # a kernel of another kind where a projection was
    assert "not plain linear layers" in fused_problem(llama)


def test_the_graphed_fused_paths_need_cuda(demo_lm):
    from engine.core.forward import SPECS

    for name in ("graphed-fused", "graphed-fused-compiled"):
        assert SPECS[name].problem(demo_lm.model) == "CUDA graphs need a model on a CUDA device"
        with pytest.raises(ValueError, match="CUDA"):
            SPECS[name].make(demo_lm.model)


def test_the_fused_step_traces_whole_for_inductor(demo_lm):
    """graphed-fused-compiled compiles the fused step inside each CUDA graph: dynamo must trace a tree forward over the
    static cache as one graph (a break would leave eager pieces between compiled ones).  Traced on the CPU, on the
    cache a compiling path keeps (transformers' own tensors, each layer's apart: ``StaticBuffers.kv`` is None)."""
    import torch._dynamo

    path = type("CompiledFused", (FusedPath,), {"compiles": True})(demo_lm.model)  # a compiled path's cache: unpacked
    forward = path.open(64, 8)
    forward.prefill(list(range(3, 20)))
    ids, pos, mask = forward._frame(8)
    forward._seek(forward.length)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(path.step)(input_ids=ids, attention_mask=mask, position_ids=pos,
                                                 cache=forward.cache, use_cache=True)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
