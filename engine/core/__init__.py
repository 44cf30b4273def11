"""The primitives every layer above builds on: the draft tree (one parent array), verification and its read-back,
the KV cache, attention kernels, model compatibility, host transfers, acceptance estimates and the theory's bounds.
Imports nothing of goose-lens outside this package."""
