"""transformer-jax: the encoder-decoder Transformer of "Attention Is All You Need" in JAX/Flax.

The model, its configuration and the attention equations are importable without the data stack
(tensorflow-datasets, grain): those live in `transformer_jax.data` and are imported only there.
"""
from transformer_jax.attention import (
                                       LengthMask,
                                       causal_mask,
                                       combine_masks,
                                       padding_mask,
                                       row_lengths,
                                       scaled_dot_product_attention,
                                       segment_mask,
                                       sinusoidal_position_encoding,
)
from transformer_jax.config import SIZES, TransformerConfig, model_config
from transformer_jax.model import (
                                       Decoder,
                                       Encoder,
                                       Transformer,
                                       count_params,
                                       init_cache,
                                       shift_right,
)

__all__ = [
    "SIZES", "Decoder", "Encoder", "LengthMask", "Transformer", "TransformerConfig",
    "causal_mask", "combine_masks", "count_params", "init_cache", "model_config", "padding_mask",
    "row_lengths", "scaled_dot_product_attention", "segment_mask", "shift_right",
    "sinusoidal_position_encoding",
]
