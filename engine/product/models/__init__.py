"""A model on this machine: named models fetched and converted, loading, the page's registry of loaded models, the
machine's facts (free memory, the CPU), precision and its kernels, the forward path, the cost curve and the engine
thread."""
