"""Every family a user brings: works losslessly, or is refused in one sentence (engine/core/compat.py).

Tiny randomly initialised models built from each family's transformers config class (hidden 64, 2 layers,
vocabulary 256), on prompts that repeat so PLD finds matches.  fp32: token for token ``generate(do_sample=False)``
with draft tokens accepted.  bf16: every divergence from AR a precision tie (engine/product/runs/lossless.py), none a
bug,
drafts accepted.  Refused families raise ``compat.UnsupportedModelError`` with one sentence naming the reason
and the remedy.  Position limits (a learned position table, a sliding window, longrope's switch) trim the
trees near them and refuse only a run that cannot fit.
"""
from __future__ import annotations

import copy
import functools
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers as tf
from test_lossless import run_and_compare
from test_precision import _bf16_run
from transformers import AutoModelForCausalLM

from engine.core import compat, kv_cache
from engine.core.tree import DraftTree, Source
from engine.core.verify import forward_tree
from engine.decoding.config import DecodeConfig
from engine.product.models import kernels
from engine.product.models.loading import ModelLoadError, load_model
from engine.product.runs.decoder import make_decoder

VOCAB, MAX_NEW = 256, 40
IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": None}  # no EOS: both runs go the full length
COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, **IDS}
MOE = {"num_experts_per_tok": 2}
CONFIG = DecodeConfig.of(max_new_tokens=MAX_NEW, gt_threshold=0.0)  # c = 0: whole trees of B = 60, no cost curve

#: family -> its tiny config (sliding-window families with a window of 256, wider than every run here)
FAMILIES = {
    "llama": lambda: tf.LlamaConfig(**COMMON),
    "qwen2": lambda: tf.Qwen2Config(**COMMON),
    "qwen3": lambda: tf.Qwen3Config(**COMMON, head_dim=16),
    "mistral": lambda: tf.MistralConfig(**COMMON, sliding_window=256),
    "gemma": lambda: tf.GemmaConfig(**COMMON, head_dim=16),
    "gemma2": lambda: tf.Gemma2Config(**COMMON, head_dim=16, sliding_window=256),  # soft-capping, eager
    "gemma3-text": lambda: tf.Gemma3TextConfig(**COMMON, head_dim=16, sliding_window=256),
    "phi": lambda: tf.PhiConfig(**COMMON),
    "phi3": lambda: tf.Phi3Config(**COMMON),
    "olmo2": lambda: tf.Olmo2Config(**COMMON),
    "stablelm": lambda: tf.StableLmConfig(**COMMON),
    "granite": lambda: tf.GraniteConfig(**COMMON),  # embedding / residual / attention / logit multipliers
    "cohere": lambda: tf.CohereConfig(**COMMON),  # logit scale
    "gpt2": lambda: tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512, **IDS),
    "gpt-neox": lambda: tf.GPTNeoXConfig(**{**COMMON, "num_key_value_heads": 4}),
    "opt": lambda: tf.OPTConfig(vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                num_attention_heads=4, max_position_embeddings=512, word_embed_proj_dim=64, **IDS),
    "falcon": lambda: tf.FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      **IDS),
    "starcoder2": lambda: tf.Starcoder2Config(**COMMON, sliding_window=256),
    "qwen2-moe": lambda: tf.Qwen2MoeConfig(**COMMON, **MOE, num_experts=4, moe_intermediate_size=64,
                                           shared_expert_intermediate_size=64),
    "mixtral": lambda: tf.MixtralConfig(**COMMON, **MOE, num_local_experts=4),
    "olmoe": lambda: tf.OlmoeConfig(**COMMON, **MOE, num_experts=4),
}

ALIBI = "ALiBi position biases"
RECURRENT = "keeps recurrent state"
KERNEL = "switch to sdpa or eager"
#: family -> (its tiny config, the reason its sentence must give)
REFUSED = {
    "bloom": (lambda: tf.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4, **IDS), ALIBI),
    "mpt": (lambda: tf.MptConfig(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2, max_seq_len=512, **IDS), ALIBI),
    "falcon-alibi": (lambda: tf.FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, alibi=True, **IDS), ALIBI),
    "mamba": (lambda: tf.MambaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, state_size=8, **IDS),
              RECURRENT),
    "jamba": (lambda: tf.JambaConfig(**COMMON, num_experts=2, attn_layer_period=2, attn_layer_offset=1,
                                     expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8,
                                     use_mamba_kernels=False), RECURRENT),
    "rwkv": (lambda: tf.RwkvConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, attention_hidden_size=64,
                                   intermediate_size=128, context_length=512, **IDS), RECURRENT),
    "gemma3n-text": (lambda: tf.Gemma3nTextConfig(**{**COMMON, "num_hidden_layers": 4}, head_dim=16,
                                                  vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8,
                                                  num_kv_shared_layers=2, laurel_rank=8, sliding_window=256,
                                                  activation_sparsity_pattern=[0.0] * 4,
                                                  layer_types=["sliding_attention", "full_attention"] * 2),
                     "share or index keys and values"),
    "llama-flex-attention": (lambda: tf.LlamaConfig(**COMMON, attn_implementation="flex_attention"), KERNEL),
    "llama-paged-eager": (lambda: tf.LlamaConfig(**COMMON, attn_implementation="paged|eager"), KERNEL),
}


@functools.cache
def tiny(name: str) -> torch.nn.Module:
    """The family's tiny fp32 model, randomly initialised with seed 0 (built once per test session)."""
    torch.manual_seed(0)
    config = FAMILIES[name]() if name in FAMILIES else REFUSED[name][0]()
    return AutoModelForCausalLM.from_config(config).eval()


def prompts(n: int = 2, length: int = 24) -> list[list[int]]:
    """Random prompts whose first half comes back at their end: the PLD matcher finds something to copy."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        p = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
        out.append(p + p[: length // 2])
    return out


def assert_one_sentence(message: str, *needles: str) -> None:
    """One line, one sentence (no full stop inside, none doubled), containing every needle."""
    assert "\n" not in message and ".." not in message and ". " not in message, message
    assert message[0].islower() and not message.endswith("."), message  # the engine's error style
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


@pytest.mark.full  # every family's tiny model, 128 tokens: the quick tier's greedy check is the demo model and SmolLM2
@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_fp32_matches_greedy(name):
    model = tiny(name)
    assert compat.model_problem(model) is None
    accepted = sum(run_and_compare(model, (), ids, CONFIG) for ids in prompts())
    assert accepted > 0, f"inconclusive: no draft token accepted on the tiny {name}"


@pytest.mark.full  # every family in bf16 (see above)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_bf16_has_no_bugs(name):
    lm = SimpleNamespace(model=copy.deepcopy(tiny(name)).to(torch.bfloat16), eos_token_ids=())
    kernels.pack_linears(lm.model)  # as load_model serves bf16 on a CPU that runs it
    accepted, found = _bf16_run(lm, prompts(), {"gt_threshold": 0.0}, MAX_NEW)
    assert accepted > 0, f"inconclusive: no draft token accepted on the tiny {name} in bf16"
    bugs = [d.sentence() for d in found if d.kind != "precision tie"]
    assert not bugs, f"{name}: divergences from AR that are not precision ties: {bugs}"


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_family_says_why_in_one_sentence(name):
    model, reason = tiny(name), REFUSED[name][1]
    with pytest.raises(compat.UnsupportedModelError) as err:
        make_decoder(model, CONFIG, ())
    assert_one_sentence(str(err.value), reason, "; ")
    assert isinstance(err.value, kv_cache.UnsupportedCacheError)  # what callers caught before still catches it


def test_a_kernel_that_cannot_take_the_tree_mask_is_refused():
    model = copy.deepcopy(tiny("llama"))
    model.config._attn_implementation = "flash_attention_2"  # as loaded on a GPU with flash-attn installed
    with pytest.raises(compat.UnsupportedModelError) as err:
        make_decoder(model, CONFIG, ())
    assert_one_sentence(str(err.value), "'flash_attention_2'", KERNEL, 'attn_implementation="sdpa"')


@torch.no_grad()
def test_alibi_scores_tree_rows_wrongly_which_is_why_it_is_refused():
    """A branching tree's row whose ancestors are not next to it in the cache: rotary models score it as a
    sequential forward does (to 1e-6), ALiBi (MPT) does not."""
    prompt = list(range(10, 40))
    #        0 (anchor)  1   2   3: child of 2, at depth 2 but cache row 3
    tree = DraftTree((prompt[-1], 50, 60, 70), (None, 0, 0, 2), (Source.ROOT,) + (Source("tr"),) * 3, (1.0,) * 4,
                     (1.0,) * 4)
    for name, exact in (("llama", True), ("gpt2", True), ("mpt", False)):
        model = tiny(name)
        cache = kv_cache.new_cache(model, 64)
        model(input_ids=torch.tensor([prompt[:-1]]), cache=cache, use_cache=True)
        row = forward_tree(model, cache, tree, len(prompt) - 1)[3]
        want = model(input_ids=torch.tensor([prompt + [60, 70]])).logits[0, -1]
        assert (float((row - want).abs().max()) < 1e-5) == exact, name


def _positions(traces, prompt_len: int) -> list[tuple[int, int]]:
    """(anchor position, deepest node's position) of every tree cycle."""
    out, done = [], 1  # the prefill committed one token
    for tr in traces[1:]:
        anchor = prompt_len + done - 1
        out.append((anchor, anchor + max(tr.tree.depths)))
        done = tr.total_tokens
    return out


@pytest.mark.parametrize("name", ["gpt2", "opt"])
def test_learned_position_table_trims_trees_at_its_end_and_refuses_only_a_run_that_cannot_fit(name):
    """GPT-2 / OPT have no row past their table (an index error before): a run that fills the table exactly
    stays lossless, every tree inside it, PTD's ride-along rows sitting out near the end; one more is refused."""
    config = FAMILIES[name]()
    config.max_position_embeddings = 64
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    accepted = 0
    for ids in prompts():
        new = 64 - len(ids)
        for cfg in (CONFIG.with_(max_new_tokens=new), CONFIG.with_(max_new_tokens=new, sources=("pld", "tr", "ptd"))):
            accepted += run_and_compare(model, (), ids, cfg)
        traces = list(make_decoder(model, CONFIG.with_(max_new_tokens=new), ()).generate(ids))
        assert all(deepest < 64 for _, deepest in _positions(traces, len(ids)))
    assert accepted > 0, f"inconclusive: no draft token accepted on the tiny {name} at its table's end"
    ids = prompts()[0]
    with pytest.raises(compat.UnsupportedModelError) as err:
        next(make_decoder(model, CONFIG.with_(max_new_tokens=64 - len(ids) + 1), ()).generate(ids))
    assert_one_sentence(str(err.value), "context of 64 tokens", f"lower max new tokens to {64 - len(ids)} or fewer")


@pytest.mark.parametrize("name", ["mistral", "gemma2", "gemma3-text", "starcoder2", "qwen2-sliding"])
def test_sliding_window_trims_trees_at_its_end_and_refuses_only_a_run_that_cannot_fit(name):
    """The cache is kept full, which equals the window while every position is inside it."""
    if name == "qwen2-sliding":
        config = tf.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=64, max_window_layers=0)
    else:
        config = FAMILIES[name]()
        config.sliding_window = 64
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert compat.PositionLimits.of(model).window == 64
    accepted = 0
    for ids in prompts():
        accepted += run_and_compare(model, (), ids, CONFIG.with_(max_new_tokens=64 - len(ids)))
    assert accepted > 0, f"inconclusive: no draft token accepted on the tiny {name} at its window's end"
    ids = prompts()[0]
    with pytest.raises(compat.UnsupportedModelError) as err:
        next(make_decoder(model, CONFIG.with_(max_new_tokens=64 - len(ids) + 1), ()).generate(ids))
    assert_one_sentence(str(err.value), "sliding attention window of 64 tokens")


@pytest.mark.full  # several seconds of decoding (the quick tier keeps what issue 32 names and the sub-second tests)
def test_longrope_trees_never_straddle_the_switch():
    """Phi-3's longrope scores a whole forward with the long factors once its largest position reaches
    original_max_position_embeddings; AR's steps below it use the short ones.  Trees stop short of it."""
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 48,
            "short_factor": [1.0] * 8, "long_factor": [4.0 + i for i in range(8)]}
    config = tf.Phi3Config(**COMMON, rope_parameters=rope, original_max_position_embeddings=48)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert compat.PositionLimits.of(model).switch == 48
    accepted = 0
    for ids in prompts():
        accepted += run_and_compare(model, (), ids, CONFIG)  # 36 + 40 tokens: the run crosses 48
        traces = list(make_decoder(model, CONFIG, ()).generate(ids))
        assert all(deepest < 48 or anchor >= 48 for anchor, deepest in _positions(traces, len(ids)))
        assert any(anchor >= 48 for anchor, _ in _positions(traces, len(ids)))
    assert accepted > 0, "inconclusive: no draft token accepted on the tiny longrope Phi-3"


def test_load_model_refuses_in_one_sentence(tmp_path):
    """The page and the CLI hear it at load time, before any forward (the precision measurement's too)."""
    tiny("bloom").save_pretrained(tmp_path)
    demo = Path(__file__).resolve().parents[1] / "assets" / "demo-model"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo / name, tmp_path / name)
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path), device="cpu", dtype="fp32")
    message = str(err.value)
    assert message.startswith(f"could not use model {tmp_path.name!r}: this model (bloom) adds ALiBi"), message
    assert_one_sentence(message.split(": ", 1)[1], ALIBI)


def test_page_context_check_is_the_decoders():
    """``LoadedModel.context_problem`` (page settings, CLI) gives the decoder's sentence, as a page sentence."""
    from engine.product.models.loaded import LoadedModel

    config = FAMILIES["mistral"]()
    config.sliding_window = 64
    torch.manual_seed(0)
    lm = LoadedModel(AutoModelForCausalLM.from_config(config).eval(), None, "tiny", "cpu", torch.float32)
    assert lm.context_problem(30, 34) is None
    problem = lm.context_problem(30, 35)
    assert problem == ("The prompt is 30 tokens and with 35 new tokens the run needs 65 positions, more than the "
                       "model's sliding attention window of 64 tokens, beyond which it no longer attends to the "
                       "earliest keys while a draft tree still would; lower max new tokens to 34 or fewer or shorten "
                       "the prompt to 29 tokens or fewer.")
