"""Which models, and which runs of them, tree verification serves losslessly: checked before the first forward.

Tree verification (``verify.forward_tree``) scores n draft-tree rows in one forward of the stock model with a
float tree attention mask (1, 1, n, past + n), position ids ``past + depth`` and a ``DynamicCache`` that is then
compacted to the accepted path (``kv_cache.keep_path``).  A model takes that exactly when:

1. its attention kernel adds an arbitrary float mask to the scores: ``sdpa`` or ``eager``.  Flash-attention,
   flex-attention and paged kernels build their own masks from sequence lengths or block masks, and never see
   the tree mask (flex on a CPU corrupts memory outright);
2. its positions come from the position ids: ALiBi (Bloom, MPT, Falcon with ``alibi=True``) biases each key by
   its place in the KV cache, and a tree row's ancestors are not at their positions there (measured on a
   random MPT: the tree rows' logits are 0.016 off a sequential forward's, rotary models 1e-7);
3. every layer keeps per-token keys and values: recurrent, linear-attention and convolution state (Mamba, RWKV,
   Jamba, Zamba, RecurrentGemma, Qwen3-Next, LFM2, ...) would absorb the rejected branches and cannot be
   rolled back to the accepted path; layers that reuse another layer's KV (Gemma3n) cannot be compacted;
4. no forward reaches a position where the model computes differently from AR (``PositionLimits``): past
   its position table (learned absolute positions, GPT-2 / OPT, have no row there: an index error), past a
   sliding or chunked attention window (the cache is kept full, which equals the window only while every
   position is inside it), or, for longrope (Phi-3), across ``original_max_position_embeddings``, where
   transformers switches every row of a forward from the short to the long factors by the forward's largest
   position (a tree crossing it would score its rows below the switch with the long factors, AR with the short).

1-3 are properties of the model: ``model_problem`` / ``check_model`` (``SpecDecoder.__init__``,
``loading.load_model``).  4 is per run: ``PositionLimits.problem`` refuses a run whose prompt + new tokens
cannot fit (``SpecDecoder.generate``, ``LoadedModel.context_problem`` for the page and the CLI), and
``PositionLimits.room`` trims each cycle's tree to the depth that fits (``Planner.build``), so drafts
near a limit are shortened, never the run refused.

Every refusal is one sentence (lower-case start, no final full stop, as the other engine errors) naming the
reason and what to do.
"""
from __future__ import annotations

from dataclasses import dataclass

from .kv_cache import UnsupportedCacheError, sliding_window, unsupported_layers

#: sdpa with grouped query heads packed instead of key/value heads repeated (``engine.core.attention``).
TREE_SDPA = "tree_sdpa"
#: Attention implementations that add the float tree mask to the attention scores as given.
TREE_MASK_KERNELS = ("sdpa", "eager", TREE_SDPA)
#: Families that always add ALiBi biases (Falcon does when ``alibi=True``; see ``uses_alibi``).
ALIBI_FAMILIES = frozenset({"bloom", "mpt"})
#: Recurrent families whose cache layers do not show it (they keep their state outside ``DynamicCache``).
RECURRENT_FAMILIES = frozenset({"rwkv", "xlstm"})


class UnsupportedModelError(UnsupportedCacheError):
    """A model, or a run of it, that tree verification cannot serve losslessly.

    The message is one sentence naming the reason and what to do.  A subclass of
    ``kv_cache.UnsupportedCacheError``, so callers that caught the cache's refusals catch these too.
    """


def _family(config) -> str:
    """The model's family as transformers names it (``model_type`` of the text model, e.g. "bloom")."""
    return getattr(config.get_text_config(), "model_type", None) or config.model_type or type(config).__name__


def attention_kernel(config) -> str | None:
    """The attention implementation the model runs (``config._attn_implementation``, the text model's for a
    composite model); None when the config was never attached to a model (transformers' default, sdpa)."""
    text = config.get_text_config()
    return getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)


def uses_alibi(config) -> bool:
    """Whether the model adds ALiBi position biases (Bloom, MPT, Falcon with ``alibi=True``, remote-code models
    declaring ``position_embedding_type = "alibi"``)."""
    text = config.get_text_config()
    return (getattr(text, "model_type", "") in ALIBI_FAMILIES or getattr(text, "alibi", False) is True
            or getattr(text, "position_embedding_type", None) == "alibi")


def model_problem(model) -> str | None:
    """Why tree verification cannot serve ``model`` at all, as one sentence with the remedy; None when it can.

    Reads the config only (and builds an empty ``DynamicCache`` of it): no forward, no weights touched.

    Args:
        model: a transformers causal LM (``PreTrainedModel``), or anything with its ``config``.
    """
    config = model.config
    family = _family(config)
    kernel = attention_kernel(config)
    if kernel is not None and kernel not in TREE_MASK_KERNELS:
        return (f"this model runs the {kernel!r} attention kernel, which builds its own mask and cannot take the "
                f"float tree attention mask a draft tree needs; switch to sdpa or eager "
                f"(attn_implementation=\"sdpa\" when loading, or model.set_attn_implementation(\"sdpa\"))")
    if uses_alibi(config):
        return (f"this model ({family}) adds ALiBi position biases, which follow each key's place in the KV cache "
                f"rather than a position id, so the rows of a draft tree, which need per-row position ids, would be "
                f"scored wrongly; use a model with rotary or learned position embeddings, such as Llama, Qwen, "
                f"Mistral or GPT-2")
    layers = unsupported_layers(config)
    if family in RECURRENT_FAMILIES or any(name.startswith("LinearAttention") for name in layers):
        held = f" ({', '.join(layers)})" if layers else ""
        return (f"this model ({family}) keeps recurrent state{held} instead of per-token keys and values, so the "
                f"rejected branches of a draft tree would enter that state and could not be taken back; use an "
                f"attention-only model (recurrent and hybrid families such as Mamba, RWKV, Jamba, Zamba or "
                f"Qwen3-Next are not supported)")
    if layers:
        return (f"this model ({family}) has cache layers that share or index keys and values ({', '.join(layers)}), "
                f"which cannot be compacted to a draft tree's accepted path; use a model whose every layer keeps its "
                f"own full or sliding-window KV cache")
    return None


def check_model(model) -> None:
    """Refuse ``model`` before its first forward when tree verification cannot serve it (``model_problem``).

    Raises:
        UnsupportedModelError: the attention kernel cannot take the tree mask, ALiBi positions, or recurrent /
            shared-KV layers; the message is one sentence with the remedy.
    """
    problem = model_problem(model)
    if problem:
        raise UnsupportedModelError(problem)


def _longrope_switch(text) -> int | None:
    """``original_max_position_embeddings`` of a longrope model (where transformers switches the factors)."""
    params = getattr(text, "rope_parameters", None) or {}
    groups = params.values() if params and all(isinstance(v, dict) for v in params.values()) else [params]
    switches = [g.get("original_max_position_embeddings") or getattr(text, "original_max_position_embeddings", None)
                for g in groups if isinstance(g, dict) and g.get("rope_type") == "longrope"]
    switches = [int(s) for s in switches if s]
    return min(switches) if switches else None


@dataclass(frozen=True)
class PositionLimits:
    """The positions a forward of one model may reach and still compute what AR computes (module doc, item 4).

    Attributes:
        table: ``max_position_embeddings`` (``n_positions`` for GPT-2): the rows of a learned absolute position
            table, and for rotary models the context they were built for (dynamic NTK RoPE rescales past it);
            None when the config has none (recurrent models).
        window: the shortest sliding / chunked attention window in tokens (``kv_cache.sliding_window``), or None.
        switch: longrope's ``original_max_position_embeddings``: a forward whose positions straddle it is scored
            with the long factors throughout, AR's steps below it with the short ones; None without longrope.
    """

    table: int | None = None
    window: int | None = None
    switch: int | None = None

    @classmethod
    def of(cls, model) -> PositionLimits:
        """The limits of ``model`` (a transformers causal LM), read from its config."""
        text = model.config.get_text_config()
        table = getattr(text, "max_position_embeddings", None)
        return cls(int(table) if table else None, sliding_window(model.config), _longrope_switch(text))

    def room(self, past_len: int) -> int | None:
        """Deepest draft-tree depth (root = 0) a forward may reach this cycle; None when unbounded.

        The anchor (depth 0) sits at position ``past_len`` and a node of depth d at ``past_len + d``: every such
        position stays below the table and the window, and below the longrope switch while the anchor is.  At
        least 0 (the anchor alone, an AR step) whenever the run passed ``problem``.
        """
        ends = [limit for limit in (self.table, self.window) if limit]
        if self.switch and past_len < self.switch:
            ends.append(self.switch)
        return max(0, min(ends) - 1 - past_len) if ends else None

    def problem(self, prompt_tokens: int, max_new_tokens: int) -> str | None:
        """Why a run of ``prompt_tokens`` + ``max_new_tokens`` cannot fit the model's positions, as one sentence
        with the remedy; None when it fits (trees are then trimmed to ``room``, never the run refused).  The run
        fits when prompt + new tokens ≤ the table and the window, as ``generate`` feeds positions below that."""
        need, new = prompt_tokens + max_new_tokens, f"{max_new_tokens} new token{'s' * (max_new_tokens != 1)}"
        for limit, what in ((self.window, "sliding attention window"), (self.table, "context")):
            if limit and need > limit:
                fixes = [f"lower max new tokens to {limit - prompt_tokens} or fewer"] if limit > prompt_tokens else []
                if limit > max_new_tokens:
                    fixes.append(f"shorten the prompt to {limit - max_new_tokens} tokens or fewer")
                fix = " or ".join(fixes) or f"keep prompt + new tokens within {limit}"
                why = (", beyond which it no longer attends to the earliest keys while a draft tree still would"
                       if what == "sliding attention window" else "")
                return (f"the prompt is {prompt_tokens} tokens and with {new} the run needs {need} positions, more "
                        f"than the model's {what} of {limit} tokens{why}; {fix}")
        return None


def run_problem(model, prompt_tokens: int, max_new_tokens: int) -> str | None:
    """``model_problem``, else ``PositionLimits.problem`` of this run: one sentence with the remedy, or None."""
    return model_problem(model) or PositionLimits.of(model).problem(prompt_tokens, max_new_tokens)


def check_run(model, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse a run before its first forward when the model or the run's length cannot be served.

    Raises:
        UnsupportedModelError: ``run_problem``'s sentence.
    """
    problem = run_problem(model, prompt_tokens, max_new_tokens)
    if problem:
        raise UnsupportedModelError(problem)
