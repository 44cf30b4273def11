"""Model loading: hub id or local path, device and dtype choice, accelerate device_map for several GPUs."""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

#: The embedded demo model (trained by scripts/train_demo_model.py), used when no --model is given.
DEMO_MODEL = str(Path(__file__).resolve().parents[1] / "assets" / "demo-model")
#: Environment variable that overrides the default model (a hub id or a local path), e.g. on a Space.
MODEL_ENV = "GOOSE_LENS_MODEL"

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class ModelLoadError(RuntimeError):
    """The model or tokenizer could not be loaded; the message names the id or path and the reason."""


@dataclass(frozen=True)
class LoadedModel:
    model: object  # transformers PreTrainedModel, eval mode
    tokenizer: object  # transformers tokenizer
    name: str  # the id or path it was loaded from
    device: str  # 'cpu', 'cuda', or 'auto (device_map)'
    dtype: torch.dtype

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids from the generation config (int or list), else the tokenizer's."""
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)

    @property
    def max_context(self) -> int | None:
        """Longest sequence (prompt + new tokens) the model's config allows, or None if unknown."""
        return getattr(self.model.config.get_text_config(), "max_position_embeddings", None)

    def context_problem(self, prompt_tokens: int, max_new_tokens: int) -> str | None:
        """A message when prompt + new tokens exceed the model's context, else None."""
        limit = self.max_context
        if limit and prompt_tokens + max_new_tokens > limit:
            return (f"The prompt is {prompt_tokens} tokens; with {max_new_tokens} new tokens that exceeds the "
                    f"model's context of {limit} tokens. Shorten the prompt or lower max new tokens.")
        return None

    @torch.no_grad()
    def warm_up(self) -> None:
        """One small forward, so the first user request does not pay for lazy initialisation."""
        self.model(input_ids=torch.tensor([self.encode_prompt("warm up")], device=self.model.device))

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a user prompt; the tokenizer's chat template is applied when it has one."""
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                     tokenize=True, return_dict=False)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return self.tokenizer(text, add_special_tokens=True).input_ids


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but no CUDA device is available; use --device cpu")
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32  # half precision matmuls are slow on CPU
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_model(name_or_path: str | None = None, device: str = "auto", dtype: str = "auto",
               attn_implementation: str | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer.

    Args:
        name_or_path: hub id or local directory; None = ``$GOOSE_LENS_MODEL`` if set, else the embedded demo model.
        device: 'auto' (CUDA if present, and accelerate's device_map='auto' over several GPUs), 'cpu', 'cuda', 'cuda:N'.
        dtype: 'auto' (bf16/fp16 on CUDA, fp32 on CPU), 'fp32', 'fp16', 'bf16'.
        attn_implementation: None (transformers' default, sdpa), 'eager' or 'sdpa'.

    Raises:
        ModelLoadError: the id or path cannot be loaded (missing, no network, not a causal LM, bad device/dtype).
    """
    name = name_or_path or os.environ.get(MODEL_ENV) or DEMO_MODEL
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    multi_gpu = device == "auto" and torch.cuda.device_count() > 1
    local = Path(name).exists()
    if not local and (name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name):
        raise ModelLoadError(f"could not load model {name!r}: no such directory")
    kwargs = {"dtype": torch_dtype, "local_files_only": local}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if multi_gpu:
        kwargs["device_map"] = "auto"
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local)
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure becomes one clear message naming the model
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"could not load model {name!r}: {reason}") from exc
    if not multi_gpu:
        model = model.to(dev)
    model.eval()
    return LoadedModel(model, tokenizer, name, "auto (device_map)" if multi_gpu else dev, torch_dtype)


class ModelRegistry:
    """Loaded models by (name, device, dtype), least recently used dropped beyond ``capacity``.

    The page keeps each user's choice in ``gr.State`` as a key; the registry only shares the weights
    (read-only) between users who picked the same model.  Loading is serialised by a lock.
    """

    def __init__(self, first: LoadedModel, capacity: int = 2) -> None:
        self.capacity = capacity
        self._models: OrderedDict[tuple[str, str, str], LoadedModel] = OrderedDict()
        self._lock = threading.Lock()
        self.default_key = self.key_of(first)
        self.put(first)

    @staticmethod
    def key_of(lm: LoadedModel) -> tuple[str, str, str]:
        return (lm.name, lm.device, str(lm.dtype).removeprefix("torch."))

    def put(self, lm: LoadedModel) -> tuple[str, str, str]:
        key = self.key_of(lm)
        self._models[key] = lm
        self._models.move_to_end(key)
        for old in list(self._models):  # drop the least recently used, never the default model
            if len(self._models) <= self.capacity:
                break
            if old != self.default_key and old != key:
                del self._models[old]
        return key

    def get(self, key) -> LoadedModel:
        """The model for ``key`` (a list or tuple), or the default model when it was dropped."""
        key = tuple(key) if key else self.default_key
        return self._models.get(key) or self._models.get(self.default_key) or next(iter(self._models.values()))

    def load(self, name: str, device: str = "auto", dtype: str = "auto") -> LoadedModel:
        """Load (or reuse) a model; raises ``ModelLoadError`` and keeps every loaded model on failure."""
        with self._lock:
            want_device = resolve_device(device)
            want_dtype = resolve_dtype(dtype, want_device)
            for lm in self._models.values():
                if lm.name == name and lm.device == want_device and lm.dtype == want_dtype:
                    return lm
            lm = load_model(name, device=device, dtype=dtype)
            lm.warm_up()
            self.put(lm)
            return lm
