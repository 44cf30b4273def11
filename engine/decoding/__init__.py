"""The decoding loop and its settings (Goose Alg. 2): the config, the spine-tree builder (Alg. 1), the GT size
choice and its path calibration, the cost curve as the loop reads it, sampling warpers, the cycle's trace, and
``SpecDecoder`` itself.

Above the draft sources (it mixes them) and the primitives (tree, verify, KV cache); below the product (loading,
the CLIs, the bench, measuring the cost curve), which makes decoders with ``engine.product.runs.decoder.make_decoder``.
"""
