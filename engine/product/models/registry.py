"""The page's models: each loaded model shared by every visitor who picked it, the least recently used dropped.

A visitor's pick is a key (``ModelRegistry.key_of``) kept in the page's ``gr.State``; the registry loads a model
(``loading.load_model``) on the page's engine thread, or hands back the copy already loaded.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from engine.product.models import precision
from engine.product.models.engine_thread import EngineThread
from engine.product.models.loaded import LoadedModel
from engine.product.models.loading import load_model, resolve_device, resolve_dtype
from engine.product.models.machine import free_memory
from engine.product.models.model_source import ModelLoadError, resolve
from engine.product.models.named import Progress
from engine.product.models.speeds import RecentSpeeds


class ModelRegistry:
    """Loaded models by (name, device, dtype), least recently used dropped beyond ``capacity``.

    The page keeps each user's choice in ``gr.State`` as a key; the registry only shares the weights
    (read-only) between users who picked the same model.  Loading is serialised by a lock.  ``engine`` is the one
    thread the page runs its torch work on (``engine_thread.EngineThread``; a new one when not given).
    """

    def __init__(self, first: LoadedModel, capacity: int = 2, engine: EngineThread | None = None) -> None:
        self.capacity = capacity
        self.engine = engine or EngineThread()  # where the page runs these models' forwards (engine_thread.py)
        self.busy: str | None = None  # what the engine thread measures before any run (a cold start), for people
        self.compiling: str | None = None  # what the engine thread compiles between runs (page.startup), for people
        self.speeds = RecentSpeeds()  # what each model's last runs measured (numbers only), set side by side
        self._models: OrderedDict[tuple[str, str, str], LoadedModel] = OrderedDict()
        self._lock = threading.Lock()
        self.default_key = self.key_of(first)
        self.put(first)

    @staticmethod
    def key_of(lm: LoadedModel) -> tuple[str, str, str]:
        return (lm.name, lm.device, lm.runs.dtype)  # what runs: a GGUF file's Q4_1 is not the torch copy's fp32

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

    def make_default(self, lm: LoadedModel) -> None:
        """``lm`` becomes the model of every visitor who has not picked one (a cold start's measured precision)."""
        self.default_key = self.put(lm)

    def get(self, key) -> LoadedModel:
        """The model for ``key`` (a list or tuple), or the default model when it was dropped."""
        key = tuple(key) if key else self.default_key
        return self._models.get(key) or self._models.get(self.default_key) or next(iter(self._models.values()))

    def _check_memory(self, name: str, device: str, dtype: str | None) -> None:
        """Refuse a second copy of a loaded model (another dtype or device) that would not fit in free memory.

        Raises:
            ModelLoadError: the copy needs more than 80 % of the memory now free (host RAM, or the GPU's).
        """
        same = next((lm for lm in self._models.values() if lm.name == name), None)
        if same is None:
            return
        width = 4 if dtype in (None, precision.Q4) else torch.finfo(precision.BY_NAME[dtype]).bits // 8
        need = same.params * width * (2 if dtype is None else 1)  # auto and q4 on a CPU load fp32 first, then convert
        free = free_memory(device)
        if free is not None and need > 0.8 * free:
            raise ModelLoadError(f"a second copy of {name!r} needs about {need / 2**30:.1f} GiB and only "
                                 f"{free / 2**30:.1f} GiB are free; keep the loaded copy ({same.describe()})")

    def load(self, name: str, device: str = "auto", dtype: str = "auto",
             progress: Progress | None = None) -> LoadedModel:
        """Load (or reuse) a model; raises ``ModelLoadError`` and keeps every loaded model on failure."""
        with self._lock:
            want_name = resolve(name).name
            want_device = resolve_device(device)
            want_dtype, _ = resolve_dtype(dtype, want_device)
            for lm in self._models.values():
                same_dtype = lm.runs.dtype == want_dtype or (want_dtype is None and lm.auto_dtype)  # fp32 asked:
                # never a model whose forwards run the file's own weights (issue 70)
                if lm.name == want_name and lm.device == want_device and same_dtype:
                    return lm
            self._check_memory(want_name, want_device, want_dtype)
            # the eager path: choosing another (a compile) would hold the engine thread, and every visitor, for
            # minutes on one visitor's pick; the start model's path is chosen at start-up (page.startup.settle)
            lm = load_model(name, device=device, dtype=dtype, progress=progress, engine=self.engine)
            self.engine.call(lm.warm_up)
            self.put(lm)
            return lm
