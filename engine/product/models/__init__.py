"""A model on this machine: named models fetched and converted, loading, precision and its kernels, the forward
path, the cost curve and the engine thread."""
