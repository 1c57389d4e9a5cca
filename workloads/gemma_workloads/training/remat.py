"""What the backward pass keeps of each decoder layer and what it recomputes.

Tunix (0.1.7, `gemma4.model.DecoderLayer.__call__`) either recomputes a whole layer (`RematConfig.
DECODER`) or keeps everything; at 12 layers of the 31B model and seq 3072 the second runs out of
an 80 GB GPU, and the first costs about a fifth of the step. `use_remat` swaps each layer's class
for `RematLayer`, which wraps the layer in `nnx.remat` with one of these JAX policies:

- "full": keep only the layer's input, recompute the rest (Tunix's DECODER);
- "dots": also keep the outputs of the projections (matmuls without batch dimensions: q, k, v,
  o, gate, up, down and their LoRA factors) and the fused attention's output; recompute the
  norms, RoPE and activations, which are cheap;
- "offload": as "dots", but the projections' outputs wait in host memory (GPU and TPU; XLA moves
  them back for the backward pass);
- "none": keep everything.

The operator picks one from its HBM estimate (gemma_operator.fit.remat_policy); config.py names them.
"""

from __future__ import annotations

import jax
from flax import nnx
from tunix.models.gemma4 import model as gemma4

from gemma_workloads.config import REMAT_POLICIES
from gemma_workloads.training import scan
from gemma_workloads.training.attention import ATTENTION_OUTPUT


def policy(name: str):
    """The `jax.checkpoint` policy for a policy name (None for "none": no remat at all)."""
    policies = jax.checkpoint_policies
    if name == "full":
        return policies.nothing_saveable
    if name == "dots":
        return policies.save_from_both_policies(
            policies.dots_with_no_batch_dims_saveable, policies.save_only_these_names(ATTENTION_OUTPUT)
        )
    if name == "offload":
        return policies.save_from_both_policies(
            policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
            policies.save_only_these_names(ATTENTION_OUTPUT),
        )
    if name == "none":
        return None
    raise ValueError(f"remat policy {name!r}: expected one of {REMAT_POLICIES}")


def offload_supported(device: jax.Device | None = None) -> bool:
    """Whether the device has the pinned host memory "offload" moves activations to."""
    device = device or jax.devices()[0]
    return device.platform in ("gpu", "tpu") and any(m.kind == "pinned_host" for m in device.addressable_memories())


def use_remat(model: gemma4.Gemma4, name: str) -> None:
    """Apply the policy to every decoder layer. Call it after LoRA is applied: Qwix creates its
    parameters in a first forward pass, and parameters created inside `nnx.remat` are lost."""
    policy(name)  # refuses an unknown name
    if name == "offload" and not offload_supported():
        raise ValueError(f"remat policy 'offload' needs pinned host memory, which {jax.devices()[0].platform} lacks")
    model.config.remat_config = gemma4.RematConfig.NONE  # Tunix's own switch off: the layers decide
    for layer in scan.decoder_layers(model):
        if not isinstance(layer, RematLayer):
            layer.__class__ = RematLayer
        layer.remat_policy = name


class RematLayer(gemma4.DecoderLayer):
    """Tunix's decoder layer, rematerialised by `remat_policy`."""

    remat_policy: str = "full"

    def __call__(self, x, segment_pos, cache, attn_mask, per_layer_input=None, kv_shared_cache=None):
        chosen = policy(self.remat_policy)
        if self.remat_policy == "none":
            return self.block(x, segment_pos, cache, attn_mask, per_layer_input, kv_shared_cache)
        return nnx.remat(self.block.__func__, policy=chosen, graph_updates=False)(
            self, x, segment_pos, cache, attn_mask, per_layer_input, kv_shared_cache
        )
