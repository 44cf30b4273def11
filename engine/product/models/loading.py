"""Model loading: named models, hub ids, local folders and ``.gguf`` files; device, dtype, accelerate.

What ``--model`` accepts (``resolve`` decides which):

- ``smollm2`` / ``smollm2-135m-instruct``: SmolLM2-135M-Instruct from a PyPI wheel, converted once
  (``engine/product/models/named.py``); the default of the page, the CLI and the benchmark;
- ``demo``: the 5.5M-parameter model embedded in ``assets/demo-model`` (fully offline);
- a local ``.gguf`` file (dequantized by transformers, the same path the named model is converted by);
- a local folder or a hub id (``from_pretrained``).

A loaded model is named by an id (``LoadedModel.name``) that never contains a machine path: the named
model's name, the hub id, or the file / folder name of a local model.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import try_to_load_from_cache
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.core import attention, compat, ggml
from engine.core.forward import REGISTRY, EagerPath, ForwardPath
from engine.product.models import forward_choice, kernels, precision
from engine.product.models.cost_cache import CurveOwner
from engine.product.models.engine_thread import EngineThread
from engine.product.models.named import (
    DEFAULT_MODEL,
    DEMO_MODEL_DIR,
    DEMO_NAMES,
    NAMED,
    FetchError,
    Progress,
    ensure_model,
    load_gguf,
    source_gguf,
)
from engine.product.models.what_runs import WhatRuns, allows_file_paths

#: Environment variable that overrides the default model (a name, hub id or local path), e.g. on a Space.
MODEL_ENV = "GOOSE_LENS_MODEL"
DEMO_MODEL = "demo"  # the embedded model's name

#: Precisions a user may ask for besides "auto" ("q4": a 4-bit checkpoint's own weights, bf16 activations, on a CPU).
DTYPES = ("fp32", "fp16", "bf16", precision.Q4)


class ModelLoadError(RuntimeError):
    """The model or tokenizer could not be loaded; the message names the id or path and the reason."""


@dataclass(frozen=True)
class LoadedModel:
    """A model as the engine serves it: the transformers model and tokenizer, the precision and forward path chosen
    for this machine and why, and a public name (never a machine path).  Made by ``load_model`` (its path then set
    by ``with_forward``); frozen, so one load is shared safely by every visitor of a page.  ``forward`` is the path
    its generations run on, ``for_context(cells)`` the model as a generation of that length runs it.
    """

    model: object  # transformers PreTrainedModel, eval mode
    tokenizer: object  # transformers tokenizer
    name: str  # public id: named model, hub id, or a local model's file / folder name (never a path)
    device: str  # 'cpu', 'cuda', or 'auto (device_map)'
    dtype: torch.dtype
    title: str = ""  # human name for headers, e.g. "SmolLM2-135M-Instruct" (default: ``name``)
    dtype_reason: str = ""  # why this dtype, e.g. "bf16: verifies 16 rows 1.6× faster than fp32 here" (auto)
    auto_dtype: bool = False  # the dtype was chosen by ``dtype="auto"`` (engine/product/models/precision.py)
    param_count: int = 0  # counted at load, before bf16 linears were packed (their weights are no parameters then)
    forward_path: ForwardPath | None = None  # how trees run (engine/core/forward.py); None: the eager path
    forward_reason: str = ""  # why this path, e.g. "static: an AR step and a 16-node tree 8% faster ..." (auto)
    source: ModelSource | None = None  # where it loaded from (private: a path is never shown)

    @property
    def forward(self) -> ForwardPath:
        """The model's forward path, shared by its generations (``forward_choice.choose``; eager by default)."""
        return self.forward_path if self.forward_path is not None else EagerPath(self.model)

    def for_context(self, cells: int) -> LoadedModel:
        """This model as a generation of ``cells`` cells (prompt + max new tokens) runs it: on the path its forward
        path gives that length (``ForwardPath.at``: e.g. llama.cpp's attention without flash attention over a long
        context, where the forward choice measured it cheaper), its reason said; ``self`` where the path is the same.
        A run's record, its cost curve and its AR reference all read the model this returns (every entry point
        calls it once the prompt's length is known)."""
        here = self.forward
        path = here.at(cells)
        if path is here:
            return self
        return replace(self, forward_path=path, forward_reason=f"{path.name} for this run's {cells:,} cells "
                                                                 f"({here.longer.reason})")

    def gguf(self) -> Path | None:
        """The ``.gguf`` file the model came from (the llamacpp path runs it), or None (``named.source_gguf``)."""
        return source_gguf(self.source.fetch, self.source.path) if self.source is not None else None

    curves = property(lambda self: CurveOwner(self.model, self.forward))  # the one owner of its cost curve

    @property
    def runs(self) -> WhatRuns:
        """What runs this model's forwards: weight type, forward path, whose weights (``what_runs.WhatRuns``); the
        record every entry point shows (on llama.cpp's path the file's type, e.g. "Q4_1", never the torch dtype)."""
        return WhatRuns.of(self.precision, self.forward)

    @property
    def params(self) -> int:
        """Number of parameters (tied embeddings counted once)."""
        return self.param_count or sum(p.numel() for p in self.model.parameters())

    def summary(self) -> str:
        """The command line's model line: ``describe()``, why this precision (where it runs) and which path."""
        return (self.describe() + (f" — {self.dtype_reason}" if self.dtype_reason and not self.forward.describe() else
                                   "")
                + (f"; forward path {self.forward_reason}" if self.forward_reason else ""))

    def describe(self) -> str:
        """Header line, e.g. "SmolLM2-135M-Instruct (135M, fp32, CPU)" ("Q4_1 · llama.cpp kernels" for fp32 there)."""
        n = self.params
        size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e7 else f"{n / 1e6:.1f}M"
        dtype = self.forward.describe() or self.precision
        device = "CPU" if self.device == "cpu" else self.device
        return f"{self.title or self.name} ({size}, {dtype}, {device})"

    @property
    def precision(self) -> str:
        """'fp32', 'bf16', 'fp16' or 'q4' (``dtype`` is bf16 then: 4-bit weights, bf16 activations)."""
        return precision.precision_name(self.model)

    has_chat_template = property(lambda self: bool(getattr(self.tokenizer, "chat_template", None)))

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids from the generation config (int or list), else the tokenizer's."""
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        eos = self.tokenizer.eos_token_id if eos is None else eos
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)

    @property
    def max_context(self) -> int | None:
        """Longest sequence (prompt + new tokens) the model's config allows, or None if unknown."""
        return getattr(self.model.config.get_text_config(), "max_position_embeddings", None)

    def context_problem(self, prompt_tokens: int, max_new_tokens: int) -> str | None:
        """A sentence with the remedy when prompt + new tokens pass the model's context or sliding attention window
        (``compat.PositionLimits.problem``, which the decoder also refuses), else None."""
        problem = compat.PositionLimits.of(self.model).problem(prompt_tokens, max_new_tokens)
        return f"{problem[0].upper()}{problem[1:]}." if problem else None

    @torch.no_grad()
    def warm_up(self) -> None:
        """One small forward, so the first user request does not pay for lazy initialisation."""
        self.model(input_ids=torch.tensor([self.encode_prompt("warm up")], device=self.model.device))

    def encode_prompt(self, text: str, chat: bool | None = None) -> list[int]:
        """Token ids of a user prompt.

        Args:
            text: the prompt.
            chat: True = wrap it as one user turn in the tokenizer's chat template (ignored when the
                tokenizer has none); False = raw completion prompt; None = chat when a template exists.
        """
        if (chat is None or chat) and self.has_chat_template:
            return self.encode_messages([{"role": "user", "content": text}])
        return self.tokenizer(text, add_special_tokens=True).input_ids

    def encode_messages(self, messages: list[dict]) -> list[int]:
        """Token ids of a chat (``[{"role": ..., "content": ...}, ...]``) through the tokenizer's chat template,
        ready for the assistant's next turn.  Raises ValueError when the tokenizer has no chat template."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 return_dict=False)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def resolve_device(device: str) -> str:
    """The device a load asks for: 'auto' is 'cuda' where a CUDA device is present, else 'cpu'; any other name as given.

    Raises:
        ModelLoadError: 'cuda' or 'cuda:N' asked for on a machine without a CUDA device (one line, with the remedy).
    """
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but no CUDA device is available; use --device cpu")
    return device


def resolve_dtype(dtype: str, device: str) -> tuple[str | None, str]:
    """The precision ``dtype`` asks for on ``device`` (a ``DTYPES`` name), and a sentence when it had to fall back.

    Returns:
        (name, note): name None = "auto" on a CPU, decided by measurement once the model is loaded
        (``precision.cpu_choice``); note "" unless an unsupported request fell back (fp16 on a CPU ->
        auto; bf16 on a GPU without it -> fp16; q4 on a GPU -> the GPU's half precision).

    Raises:
        ModelLoadError: an unknown dtype name.
    """
    if dtype not in ("auto", *DTYPES):
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(DTYPES)}")
    cuda = device.startswith("cuda")
    if dtype == "fp16" and not cuda:
        return None, "fp16 is not supported on a CPU (no fast kernels); using the measured precision instead."
    if dtype == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        return "fp16", "bf16 is not supported on this GPU; using fp16 instead."
    if dtype == precision.Q4 and cuda:
        choice = precision.cuda_choice(device)
        return choice.dtype, f"q4 runs on a CPU only (torch's 4-bit CPU kernel); using {choice.dtype} instead."
    if dtype == "auto":
        return (precision.cuda_choice(device).dtype if cuda else None), ""
    return dtype, ""


@dataclass(frozen=True)
class ModelSource:
    """Where a ``--model`` value loads from: ``path`` (private) and the public ``name`` / ``title``."""

    name: str  # public id, never a machine path
    title: str  # human name
    path: str  # hub id, local folder, or local .gguf file
    local: bool
    fetch: object | None = None  # engine.product.models.named.PypiGguf to fetch and convert first, or None


def resolve(name_or_path: str | None = None) -> ModelSource:
    """What ``name_or_path`` names; None = ``$GOOSE_LENS_MODEL`` if set, else ``DEFAULT_MODEL`` (SmolLM2).

    Raises:
        ModelLoadError: a local-looking path that does not exist.
    """
    name = (name_or_path or os.environ.get(MODEL_ENV) or DEFAULT_MODEL).strip()
    key = name.lower()
    if key in DEMO_NAMES:
        return ModelSource(DEMO_MODEL, "goose-lens demo model", str(DEMO_MODEL_DIR), True)
    if key in NAMED:
        spec = NAMED[key]
        return ModelSource(spec.name, spec.title, "", True, spec)
    path = Path(name).expanduser()
    if path.exists():
        if path.resolve() == DEMO_MODEL_DIR:
            return resolve(DEMO_MODEL)
        return ModelSource(path.name, path.stem if path.suffix == ".gguf" else path.name, str(path), True)
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name or key.endswith(".gguf"):
        raise ModelLoadError(f"could not load model {name!r}: no such file or directory")
    return ModelSource(name, name.split("/")[-1], name, False)


def sentence(text: str) -> str:
    """``text`` as a sentence of a page line: a capital first letter and exactly one full stop at the end (a
    message that already ends in one is not doubled)."""
    text = text.strip().rstrip(".")
    return text[:1].upper() + text[1:] + "."


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the model hub can be asked for a model: False at once when ``HF_HUB_OFFLINE`` is set or the hub's
    host has no address, else whether a TCP connection opens within ``timeout`` s.  (transformers itself would
    retry for ~45 s before saying the hub is out of reach.)"""
    if hub_constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}:
        return False
    url = urlparse(hub_constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout):
            return True
    except OSError:  # no address (offline), refused or timed out
        return False


def check_source(src: ModelSource) -> bool:
    """Refuse at once what cannot load, in one sentence; returns whether loading may skip the hub.

    A local folder must hold ``config.json``; a local file must be a ``.gguf``; a hub id loads from the hub
    cache when it is there (no network), else needs a reachable hub.

    Raises:
        ModelLoadError: a folder that is not a model, a file that is not a ``.gguf``, or a hub id neither cached
            nor reachable.
    """
    if src.fetch is not None:
        return True
    if src.local:
        path = Path(src.path)
        if path.is_dir() and not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f"; to load its GGUF file, name the file ({ggufs[0]})" if ggufs else ""
            raise ModelLoadError(f"could not load model {src.name!r}: the folder is not a model (no config.json: a "
                                 f"model folder holds config.json, the tokenizer files and the weights){hint}")
        if path.is_file() and path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"could not load model {src.name!r}: the file is not a model (a local model is a "
                                 f"folder or a .gguf file)")
        return True
    if isinstance(try_to_load_from_cache(src.path, "config.json"), str):
        return True
    if not hub_reachable():
        named = ", ".join(sorted({spec.name for spec in NAMED.values()} | {DEMO_MODEL}))
        raise ModelLoadError(f"could not load model {src.name!r}: not a named model ({named}), a local folder or "
                             f"file, nor in the hub cache, and no hub is reachable to fetch it (give a local model "
                             f"folder or .gguf file)")
    return False


def load_model(name_or_path: str | None = None, device: str = "auto", dtype: str = "auto",
               attn_implementation: str | None = None, progress: Progress | None = None,
               engine: EngineThread | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer.

    Args:
        name_or_path: ``smollm2``, ``demo``, a local ``.gguf`` file, a local folder or a hub id; None =
            ``$GOOSE_LENS_MODEL`` if set, else SmolLM2 (fetched and converted on first use, ~1 min).
        device: 'auto' (CUDA if present, and accelerate's device_map='auto' over several GPUs), 'cpu', 'cuda', 'cuda:N'.
        dtype: 'auto' (bf16/fp16 on CUDA; on a CPU fp32, bf16 or, for a 4-bit checkpoint, q4, whichever verifies
            trees faster here, measured once and cached: ``engine.product.models.precision``), 'fp32' (exact),
            'fp16', 'bf16', 'q4' (a CPU and a 4-bit checkpoint: its own 4-bit weights, bf16 activations); an
            unsupported one falls back with a note in ``LoadedModel.dtype_reason``.
        attn_implementation: None (transformers' default, sdpa: served as ``tree_sdpa`` where the model groups
            query heads, ``engine/core/attention.py``), 'eager', 'sdpa' (transformers' own) or 'tree_sdpa'.
        progress: called with (fraction, message) while a named model is fetched and converted.
        engine: the thread that times forwards (the auto precision's measurement), e.g. the page's engine thread
            (``engine_thread.py``: forwards timed elsewhere can read twice as slow); None: the calling thread.

    Raises:
        ModelLoadError: the model cannot be had or loaded (missing, offline, checksum, not a causal LM,
            bad device/dtype), or tree verification cannot serve it (``compat.model_problem``: its attention
            kernel, ALiBi positions, recurrent layers); the message is one line naming the model and the cause.
    """
    src = resolve(name_or_path)
    local = check_source(src)  # before the device, dtype and any hub traffic: what cannot load says so at once
    dev = resolve_device(device)
    want, note = resolve_dtype(dtype, dev)
    # a CPU's "auto" loads fp32, then measures; q4 loads fp32, then finds the 4-bit codes in the weights
    torch_dtype = precision.BY_NAME[want] if want and want != precision.Q4 else torch.float32
    multi_gpu = device == "auto" and torch.cuda.device_count() > 1
    model, tokenizer = _load_weights(src, local, torch_dtype, attn_implementation, multi_gpu, progress)
    problem = compat.model_problem(model)  # before any forward (the precision measurement's too)
    if problem:
        raise ModelLoadError(f"could not use model {src.name!r}: {problem}")
    if not multi_gpu:
        model = model.to(dev)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    asked = _DtypeAsked(dtype, want, note, torch_dtype)
    torch_dtype, reason, auto = (engine.call if engine else _call)(_set_precision, model, src.name, dev, asked,
                                                                   attn_implementation)
    if not attn_implementation:  # sdpa verifies trees without copying the KV cache per head (core/attention.py)
        attention.use_tree_sdpa(model)
    return LoadedModel(model, tokenizer, src.name, "auto (device_map)" if multi_gpu else dev, torch_dtype, src.title,
                       reason, auto, params, source=src)


def with_forward(lm: LoadedModel, want: str | None = None, engine: EngineThread | None = None) -> LoadedModel:
    """``lm`` with its trees run on the forward path ``want`` (``forward_choice.choose``: "auto" or a registered path;
    None reads ``$GOOSE_LENS_FORWARD``, else "auto": the fastest path measured once per model and machine, llamacpp
    among them for a model from a ``.gguf`` file), chosen (and compiled) on ``engine`` when given."""
    want, gguf = forward_wanted(lm, want)
    choice = (engine.call if engine else _call)(forward_choice.choose, lm.model, want, gguf=gguf)
    return replace(lm, forward_path=choice.path, forward_reason=choice.reason)


def forward_wanted(lm: LoadedModel, want: str | None = None) -> tuple[str, Path | None]:
    """What ``forward_choice.choose`` is asked for ``lm``: the path ``want`` (None: ``$GOOSE_LENS_FORWARD``, else
    "auto"), and the model's ``.gguf`` file where that may pick a llamacpp path (llama-cpp-python installed, and the
    precision chosen by "auto": ``what_runs.allows_file_paths``), else None; the file is fetched only then.

    Raises:
        ModelLoadError: a llamacpp path asked by name for a model whose precision was named ("fp32"): that path would
            run the file's own weights, not the precision asked.
    """
    want = want or os.environ.get(forward_choice.ENV) or "auto"
    file_path = issubclass(REGISTRY.get(want, object), ggml.GgmlPath)
    if file_path and not allows_file_paths(lm.auto_dtype):
        raise ModelLoadError(f"the {want} forward path runs the model file's own weights on llama.cpp's kernels, "
                             f"not {lm.precision} as the dtype asked: ask dtype auto with it, or another path")
    runs_file = file_path or (want == "auto" and allows_file_paths(lm.auto_dtype))
    return want, lm.gguf() if runs_file and ggml.installed() else None


def dtype_beside(forward: str | None, otherwise: str) -> str:
    """The dtype a command asks by default beside the forward path it names: "auto" where ``forward`` is a path that
    runs the model file's own weights (only "auto" may be served by one: ``what_runs.allows_file_paths``), else
    ``otherwise`` (e.g. a script's "fp32", whose text every method shares)."""
    return "auto" if issubclass(REGISTRY.get(forward or "", object), ggml.GgmlPath) else otherwise


def _load_weights(src: ModelSource, local: bool, torch_dtype: torch.dtype, attn_implementation: str | None,
                  multi_gpu: bool, progress: Progress | None) -> tuple:
    """``load_model``'s (model, tokenizer), fetched (a named model) and read from a folder or a ``.gguf`` file.

    Raises:
        ModelLoadError: the fetch or the load failed; one line naming the model and the cause.
    """
    kwargs = {"dtype": torch_dtype, "local_files_only": local}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if multi_gpu:
        kwargs["device_map"] = "auto"
    try:
        path = str(ensure_model(src.fetch, progress or (lambda f, m: None))) if src.fetch else src.path
        if path.endswith(".gguf"):
            model, tokenizer = load_gguf(Path(path), torch_dtype)
            if attn_implementation:
                model.set_attn_implementation(attn_implementation)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local)
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except FetchError as exc:
        raise ModelLoadError(f"could not get model {src.name!r}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - any failure becomes one clear message naming the model
        reason = str(exc).strip().splitlines()[0].rstrip(" :.") if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"could not load model {src.name!r}: {reason}") from exc
    return model, tokenizer


def _call(fn, /, *args, **kwargs):
    """``fn(*args, **kwargs)`` here (``load_model`` without an engine thread)."""
    return fn(*args, **kwargs)


class _DtypeAsked(NamedTuple):
    """The ``dtype`` asked of ``load_model``, what ``resolve_dtype`` made of it (``want``, ``note``) and the
    torch dtype the weights were loaded in."""

    dtype: str
    want: str | None
    note: str
    torch_dtype: torch.dtype


def _set_precision(model, name: str, dev: str, asked: _DtypeAsked,
                   attn_implementation: str | None) -> tuple[torch.dtype, str, bool]:
    """Put the loaded ``model`` in its precision (q4's kernel; a CPU's auto measured; bf16's packed linears);
    returns (torch dtype, the reason for the choice, whether it was automatic)."""
    dtype, want, note, torch_dtype = asked
    if want == precision.Q4:
        try:
            precision.apply(model, want)  # the 4-bit kernel on the model's own codes, other linears packed
            torch_dtype = precision.BY_NAME[want]
        except ValueError as exc:
            note, want = f"q4 is not possible for this model: {exc}; using the measured precision instead.", None
    reason, auto = note, dtype == "auto" or want is None
    if want is None:  # a CPU's auto: the fastest of fp32, bf16 and (a 4-bit checkpoint) q4, measured here
        choice = precision.cpu_choice(model, name)
        torch_dtype, reason = choice.torch_dtype, " ".join(filter(None, (note, choice.reason)))
        if choice.attn and not attn_implementation:  # the measured kernel, unless the caller named one
            model.set_attn_implementation(choice.attn)
        precision.apply(model, choice.dtype)  # bf16: linears packed (precision.py's docstring); q4: 4-bit
    elif dtype == "auto":
        reason = precision.cuda_choice(dev).reason
    elif dev == "cpu" and want == "bf16":
        kernels.pack_linears(model)  # bf16 linears on weights reordered once (kernels.py)
    return torch_dtype, reason, auto


def tqdm_progress(desc: str = "model"):
    """A ``Progress`` callback drawing a tqdm bar (percent) on stderr, for the command line."""
    from tqdm import tqdm

    bar = None

    def update(fraction: float, message: str) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=100, desc=desc, unit="%", bar_format="{desc}: {percentage:3.0f}% |{bar}| {postfix}")
        bar.update(round(fraction * 100) - bar.n)
        bar.set_postfix_str(message)
        if fraction >= 1.0:
            bar.close()

    return update
