"""ntil_jax: numeric token losses for JAX.

Numerical Token Integrity Loss (NTIL, ACL 2025), its baselines and its peers
(DEL, SMMD, the number-level NTL) as pure, jit-able functions that return
unreduced per-token losses::

  loss = ce + 0.3 * ntil_jax.ntil_loss(logits, labels, digit_mask)
"""

from ntil_jax.baselines import cross_entropy
from ntil_jax.baselines import emd_loss
from ntil_jax.baselines import ntl_mse_loss
from ntil_jax.baselines import soft_digit_targets
from ntil_jax.baselines import soft_label_cross_entropy
from ntil_jax.digit_entropy import del_loss
from ntil_jax.fused import default_chunk_size
from ntil_jax.fused import fused_numeric_loss
from ntil_jax.fused import fused_token_statistics
from ntil_jax import kernels
from ntil_jax.losses import loss_from_statistics
from ntil_jax.losses import NUMERIC_LOSSES
from ntil_jax.losses import numeric_token_loss
from ntil_jax.ntil import NTILComponents
from ntil_jax.ntil import ntil_components
from ntil_jax.ntil import ntil_loss
from ntil_jax.number_level import nl_ntl_loss
from ntil_jax.numbers import number_layout
from ntil_jax.numbers import NumberLayout
from ntil_jax.smmd import smmd_loss
from ntil_jax.statistics import digit_logits
from ntil_jax.statistics import token_statistics
from ntil_jax.statistics import TokenStatistics
from ntil_jax.vocab import digit_token_ids
from ntil_jax.vocab import number_tokens
from ntil_jax.vocab import NumberTokens

__version__ = "0.1.0"

__all__ = [
    "cross_entropy",
    "default_chunk_size",
    "del_loss",
    "digit_logits",
    "kernels",
    "digit_token_ids",
    "emd_loss",
    "fused_numeric_loss",
    "fused_token_statistics",
    "loss_from_statistics",
    "NTILComponents",
    "ntil_components",
    "ntil_loss",
    "nl_ntl_loss",
    "ntl_mse_loss",
    "NUMERIC_LOSSES",
    "number_layout",
    "NumberLayout",
    "number_tokens",
    "NumberTokens",
    "numeric_token_loss",
    "smmd_loss",
    "soft_digit_targets",
    "soft_label_cross_entropy",
    "token_statistics",
    "TokenStatistics",
]
