"""Gemma 4's decoder layers as a `jax.lax.scan` over repetitions of its attention pattern, so XLA
compiles one period of layers whatever the depth (what MaxText's `scan_layers` does).

Tunix (0.1.7, `gemma4.model.Gemma4.__call__`) calls its layers one after another in Python, so the
step's program holds every layer and its compile time grows with the depth. The layers alternate
sliding and global attention (the 31B model: five sliding, one global, ten times over), and the two
kinds differ in shape (a global layer has its own head size and K = V), so the scanned unit is one
period of the pattern.

`scan_layers` restacks the model in place, once, after LoRA, attention and remat are set up: for
each position p of the period, the weights of layers p, p + P, p + 2P, ... (the frozen base's and
the LoRA factors alike) become one array with a leading axis of repetitions, placed on the mesh as
before with that axis whole. Stacking them inside each step instead would copy the model every
step. The model's `layers` become one `ScannedDecoder`, which Tunix's own forward calls as its only
layer (with a KV cache for decoding, stacked the same way); each layer in the scan is
rematerialised by its own policy (remat.py), as when unrolled. Layers after the last whole period
run unrolled after the scan. A model whose layers take per-layer inputs or read other layers' keys
and values (Gemma 4 E2B and E4B) stays unrolled.

Checkpoints keep the unrolled layout (`layers/<i>/...`, config.LoraMetadata): `unrolled` and
`restacked` convert the LoRA parameters and the optimizer state on their way to and from Orbax
(checkpoint_writer.LayerOrderCheckpoints), so the merge, the PEFT export, and a run resumed with
the other layout read the same files.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from tunix.models.gemma4 import model as gemma4


def period_of(kinds: Sequence) -> int:
    """The shortest p with kinds[i] == kinds[i % p] for every layer (the whole list if none)."""
    return next(p for p in range(1, len(kinds) + 1) if all(k == kinds[i % p] for i, k in enumerate(kinds)))


def why_unrolled(model: gemma4.Gemma4) -> str | None:
    """Why the model's layers cannot be scanned, or None."""
    if model.config.per_layer_input_dim > 0:
        return "its layers take per-layer inputs"
    if any(i != j for i, j in enumerate(model.kv_cache_sharing_patterns)):
        return "some of its layers read other layers' keys and values"
    kinds = [layer.attn.attn_type for layer in model.layers]
    if len(kinds) < 2 * period_of(kinds):
        return f"its attention pattern repeats less than twice in {len(kinds)} layers"
    return None


def scan_layers(model: gemma4.Gemma4, device_mesh: jax.sharding.Mesh) -> str:
    """Restack the model's layers for the scan (see the module docstring); what was done, for the log."""
    if reason := why_unrolled(model):
        return f"unrolled: {reason}"
    layers = list(model.layers)
    period = period_of([layer.attn.attn_type for layer in layers])
    repeats = len(layers) // period
    blocks = [_stack(layers[p : repeats * period : period], device_mesh) for p in range(period)]
    model.layers = nnx.List([ScannedDecoder(blocks, layers[repeats * period :], repeats)])
    rest = len(layers) - repeats * period
    return f"scanned: {repeats} x {period} layers" + (f", then {rest} unrolled" if rest else "")


def _stack(members: list[nnx.Module], device_mesh: jax.sharding.Mesh) -> nnx.Module:
    """The first layer, each of its parameters now the stack of that parameter over `members`.
    Each member's own arrays are freed as soon as they are stacked, so the model is never held twice."""
    first, others = members[0], [_params(m) for m in members[1:]]
    for path, var in _params(first).items():
        parts = [var] + [o[path] for o in others]
        spec = _spec(var)
        stacked = _stacker(len(parts), NamedSharding(device_mesh, PartitionSpec(None, *spec)))(*(p[...] for p in parts))
        for part in parts:
            _free(part[...])
        var.set_value(stacked)
        var.set_metadata(out_sharding=(None, *spec))
    return first


def _params(module: nnx.Module) -> dict[tuple, nnx.Variable]:
    return {path: v for path, v in nnx.iter_graph(module) if isinstance(v, nnx.Param)}


def _spec(var: nnx.Variable) -> tuple:
    spec = tuple(var.get_metadata("out_sharding", None) or ())
    return spec + (None,) * (len(var.shape) - len(spec))


def _free(array) -> None:
    if isinstance(array, jax.Array) and not isinstance(array, jax.core.Tracer):
        array.delete()


@functools.cache
def _stacker(count: int, sharding: NamedSharding):
    return jax.jit(lambda *parts: jnp.stack(parts), out_shardings=sharding)


@functools.cache
def _splitter(count: int):
    return jax.jit(lambda stacked: [stacked[i] for i in range(count)])


class ScannedDecoder(nnx.Module):
    """The decoder layers as `repeats` scans of `blocks` (one stacked layer per position of the
    attention pattern's period), then `rest` unrolled. Called as Tunix calls one decoder layer."""

    def __init__(self, blocks: list[nnx.Module], rest: list[nnx.Module], repeats: int):
        self.blocks = nnx.List(blocks)
        self.rest = nnx.List(rest)
        self.repeats = repeats

    def __call__(self, x, segment_pos, cache, attn_mask, per_layer_input=None, kv_shared_cache=None):
        graph, *states = nnx.split(self.blocks, nnx.Param, nnx.RngState, ...)
        params, rngs, others = states

        def period(carry, inputs):
            x, rngs = carry
            params, caches = inputs
            blocks = nnx.merge(graph, params, rngs, others)
            new = []
            for layer, layer_cache in zip(blocks, caches, strict=True):
                layer_cache, x, _ = layer(x, segment_pos, layer_cache, attn_mask)
                new.append(layer_cache)
            # LoRA dropout draws from the model's one Rngs: its count goes round, as when unrolled
            return (x, nnx.state(blocks, nnx.RngState)), (new if cache is not None else None)

        caches = cache["blocks"] if cache is not None else [None] * len(self.blocks)
        (x, rngs), new_caches = jax.lax.scan(period, (x, rngs), (params, caches))
        nnx.update(self.blocks, rngs)
        new_rest = []
        rest_caches = cache["rest"] if cache is not None else [None] * len(self.rest)
        for layer, layer_cache in zip(self.rest, rest_caches, strict=True):
            layer_cache, x, _ = layer(x, segment_pos, layer_cache, attn_mask)
            new_rest.append(layer_cache)
        return ({"blocks": new_caches, "rest": new_rest} if cache is not None else None), x, None

    def init_cache(self, batch_size: int, max_seq_len: int, dtype) -> dict:
        """Each layer's KV cache as Tunix makes it, stacked like the weights."""

        def stacked(layer: gemma4.DecoderLayer) -> dict:
            one = layer.init_cache(batch_size, max_seq_len, dtype)
            return jax.tree.map(lambda a: jnp.broadcast_to(a, (self.repeats, *a.shape)), one)

        rest: list[gemma4.DecoderLayer] = list(self.rest)
        return {
            "blocks": [stacked(layer) for layer in self.blocks],
            "rest": [layer.init_cache(batch_size, max_seq_len, dtype) for layer in rest],
        }


def decoder(model: nnx.Module) -> ScannedDecoder | None:
    """The model's scanned decoder, if its layers are scanned."""
    layers = getattr(model, "layers", None)
    if layers is not None and len(layers) == 1 and isinstance(layers[0], ScannedDecoder):
        return layers[0]
    return None


def decoder_layers(model: gemma4.Gemma4) -> list[gemma4.DecoderLayer]:
    """The model's decoder layers: a scanned decoder's stacked ones and those after its scan."""
    scanned = decoder(model)
    return [*scanned.blocks, *scanned.rest] if scanned is not None else list(model.layers)


def _where(path: tuple) -> tuple[int, str, int] | None:
    """Where a path goes through a scanned decoder: the index of `layers` in it, then `blocks` or
    `rest` and the position there."""
    for k in range(len(path) - 3):
        if path[k] == "layers" and path[k + 1] == 0 and path[k + 2] in ("blocks", "rest"):
            return k, path[k + 2], path[k + 3]
    return None


def _at_layer(path: tuple, k: int, index: int) -> tuple:
    """The path through a scanned decoder (`layers` at `k`) as the unrolled model has it for layer `index`."""
    return (*path[:k], "layers", index, *path[k + 4 :])


def unrolled(state: nnx.State, scanned: ScannedDecoder) -> nnx.State:
    """`state` (of the model or its optimizer) with each stacked array of the decoder split back into
    its layers, at the paths the unrolled model has (`layers/<i>/...`)."""
    period, repeats = len(scanned.blocks), scanned.repeats
    out = []
    for path, var in nnx.to_flat_state(state):
        where = _where(path)
        if where is None:
            out.append((path, var))
            continue
        k, group, position = where
        if group == "rest":
            out.append((_at_layer(path, k, repeats * period + position), var))
            continue
        spec = var.get_metadata("out_sharding", None)
        unstacked = {"out_sharding": tuple(spec[1:])} if spec else {}
        for r, piece in enumerate(_splitter(repeats)(var[...])):
            out.append((_at_layer(path, k, r * period + position), var.copy(piece, **unstacked)))
    return nnx.from_flat_state(out)


def restacked(template: nnx.State, layers: nnx.State, scanned: ScannedDecoder) -> nnx.State:
    """`template` (a scanned model's state) with the values of `layers`, a state in the unrolled
    layout (what `unrolled` makes)."""
    period, repeats = len(scanned.blocks), scanned.repeats
    values = dict(nnx.to_flat_state(layers))
    out = []
    for path, var in nnx.to_flat_state(template):
        where = _where(path)
        if where is None:
            out.append((path, values[path]))
            continue
        k, group, position = where
        if group == "rest":
            out.append((path, var.copy(values[_at_layer(path, k, repeats * period + position)][...])))
            continue
        parts = [values[_at_layer(path, k, r * period + position)][...] for r in range(repeats)]
        out.append((path, var.copy(_stacker(repeats, var[...].sharding)(*parts))))
    return nnx.from_flat_state(out)
