"""llama-cpp-python as the llamacpp forward path uses it: the package loaded once (its backend initialised, its log
quiet), a GGUF file's model (weights, vocabulary, weight type), and the CPU's physical cores for its threads.

llama-cpp-python is optional, imported lazily: ``library`` raises ``GgmlUnavailable`` (the install line) without it.
Source: llama.cpp ``include/llama.h`` (``llama_backend_init``, ``llama_model_load_from_file``, ``llama_model_desc``,
``llama_vocab_n_tokens``).
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from pathlib import Path

INSTALL = 'CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" pip install llama-cpp-python==0.3.36'  # the library alone

_ready = threading.Lock()
_initialised = False
_loaded: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (file, size, mtime) -> its LlamaModel
_loaded_lock = threading.Lock()  # (``LlamaModel.shared``: the weights, read-only, loaded once while held)


class GgmlUnavailable(RuntimeError):
    """llama-cpp-python cannot be imported; the message carries the install line (``INSTALL``)."""


def installed() -> bool:
    """Whether llama-cpp-python can be imported here (found, not imported: cheap)."""
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def library():
    """The ``llama_cpp`` module, its backend initialised once; its log quiet unless its logger was configured."""
    global _initialised
    try:
        import llama_cpp
    except (ImportError, OSError) as exc:  # OSError: the package is there but its shared library is not
        raise GgmlUnavailable(f"the llamacpp forward path needs llama-cpp-python: {INSTALL} ({exc})") from exc
    with _ready:
        if not _initialised:
            logger = logging.getLogger("llama-cpp-python")  # the package's log callback prints at this level
            if logger.level == logging.NOTSET:
                logger.setLevel(logging.ERROR)
            llama_cpp.llama_backend_init()
            _initialised = True
    return llama_cpp


def physical_cores() -> int:
    """Physical cores this process may run on (its CPU affinity, a core's hyper-threads counted once); the
    affinity's CPU count where the topology cannot be read."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores))


def weight_type(lib, model) -> str:
    """The weight type of the ``llama_model *`` ``model`` as llama.cpp names it, e.g. "Q4_1": the last word of
    ``llama_model_desc`` ("llama ?B Q4_1"); "GGUF" where the description is empty."""
    desc = ctypes.create_string_buffer(128)
    lib.llama_model_desc(model, desc, len(desc))
    return desc.value.decode(errors="replace").split()[-1] if desc.value else "GGUF"


def amx_built(lib) -> bool:
    """Whether this build of llama.cpp has its AMX kernels (``llama_print_system_info`` lists "AMX_INT8 = 1": built with
    ``-march=native`` on a CPU with AMX).  There ``llama_model_load_from_file`` repacks the weights into an AMX
    buffer (an "extra buffer type"), and on some Sapphire Rapids hosts the first decode on it segfaults (seen on a
    2-core virtual Xeon with AMX here, with llama.cpp's own ``Llama.generate`` too; llama.cpp issue 20824,
    ``ggml_backend_amx_mul_mat``), so ``LlamaModel`` keeps the weights in plain CPU buffers there.  ``.ci/run`` builds
    without AMX (``-mno-amx-int8``) so that llama.cpp's own methods in the benchmark run as well."""
    return b"AMX_INT8 = 1" in lib.llama_print_system_info()


class LlamaModel:
    """llama.cpp's model (the GGUF file's weights), freed when its last holder (path or context) is gone.

    Attributes:
        ptr: the ``llama_model *``; vocab: its ``llama_vocab *``; n_vocab: its vocabulary size (tokens).
        weight_type: the file's weight type as llama.cpp names it, e.g. "Q4_1" (``weight_type``).
    """

    def __init__(self, lib, gguf: Path) -> None:
        params = lib.llama_model_default_params()
        params.use_extra_bufts = not amx_built(lib)  # AMX's repacked weights: a segfault on some hosts (amx_built)
        ptr = lib.llama_model_load_from_file(str(gguf).encode(), params)
        if not ptr:
            raise ValueError(f"llama.cpp could not load {gguf} (see its log on stderr)")
        self.ptr = ptr
        self.vocab = lib.llama_model_get_vocab(ptr)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.weight_type = weight_type(lib, ptr)
        weakref.finalize(self, lib.llama_model_free, ptr)

    @classmethod
    def shared(cls, lib, gguf: Path) -> LlamaModel:
        """The file's weights loaded once while anything holds them: every path on the same unchanged file (the
        chosen path and its path for long generations, the candidates a forward choice times) reads one copy, as
        llama.cpp lets many contexts share a model.  Keyed by the resolved path, size and modification time."""
        stat = Path(gguf).stat()
        key = (str(Path(gguf).resolve()), stat.st_size, stat.st_mtime_ns)
        with _loaded_lock:
            model = _loaded.get(key)
            if model is None:
                model = _loaded[key] = cls(lib, gguf)
            return model
