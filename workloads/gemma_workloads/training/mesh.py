"""The device mesh (fsdp x tp) and fitting parameter shardings to it.

Tunix's Gemma 4 names mesh axes `fsdp` and `tp` in its sharding annotations. Tensor parallelism
stops at 4: the 31B model's global layers have 4 KV heads, so tp 8 does not divide them (the seed
paper saw tp 8 fail); the rest of the devices go to fsdp. That gives the paper's v5p-8 mesh,
4 devices -> (1, 4), and 8 -> (2, 4).
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from tunix.utils import mesh as tunix_mesh

from gemma_workloads.config import MeshConfig

log = logging.getLogger(__name__)

AXES = ("fsdp", "tp")
MAX_TP = 4


def default_shape(devices: int) -> tuple[int, int]:
    """(fsdp, tp) for a device count: tp as large as divides it, up to 4."""
    tp = math.gcd(devices, MAX_TP)
    return devices // tp, tp


def make_mesh(config: MeshConfig | None) -> jax.sharding.Mesh:
    shape = (config.fsdp, config.tp) if config else default_shape(jax.device_count())
    if math.prod(shape) != jax.device_count():
        raise ValueError(
            f"mesh fsdp={shape[0]} x tp={shape[1]} needs {math.prod(shape)} devices; there are {jax.device_count()}"
        )
    return tunix_mesh.create_mesh(shape, AXES)


@contextlib.contextmanager
def active(device_mesh: jax.sharding.Mesh) -> Iterator[jax.sharding.Mesh]:
    """The mesh as Tunix 0.1.7 finds it: it reads the legacy `with mesh:` context
    (`pxla.thread_resources`, tunix/sft/peft_trainer.py and tunix/utils/sharding_utils.py), which
    `jax.set_mesh` does not set. JAX's notice that this context is deprecated is therefore for
    Tunix to act on; it is silenced here, and only here, so that any other one still shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`with mesh:` context manager has been deprecated", category=DeprecationWarning
        )
        device_mesh.__enter__()
    try:
        yield device_mesh
    finally:
        device_mesh.__exit__(None, None, None)


def initialize_distributed(num_hosts: int) -> None:
    """Join the other hosts of a multi-host slice (GKE's TPU webhook provides the addresses)."""
    if num_hosts > 1:
        jax.distributed.initialize()
        if jax.process_count() != num_hosts:
            raise RuntimeError(f"expected {num_hosts} hosts, JAX sees {jax.process_count()}")


def fitted_spec(shape: tuple[int, ...], spec: tuple, mesh_shape: dict[str, int]) -> tuple:
    """`spec` with every mesh axis that does not divide its dimension replaced by None."""

    def size(axis) -> int:
        names = axis if isinstance(axis, tuple) else (axis,)
        return math.prod(mesh_shape.get(n, 1) for n in names)

    return tuple(
        a if a is None or dim % size(a) == 0 else None for a, dim in zip(spec, shape, strict=False)
    )  # a spec may be shorter than the rank


def fit_to_mesh(module: nnx.Module, mesh: jax.sharding.Mesh, *, place: bool) -> list[str]:
    """Replicate the axes of parameters that do not divide the mesh instead of failing.

    Tunix annotates every projection for fsdp/tp whatever its size (the tiny models' 2 KV heads,
    Gemma 4 E4B's 2 KV heads on tp 4), and Qwix copies the base weight's annotation onto its LoRA
    parameters, so any such dimension would stop the run at load or at LoRA creation. With
    `place`, arrays are also moved to the fitted sharding (after LoRA is applied); without, only
    the annotations change (on the abstract model, before weights are loaded).
    Logs and returns a description of each replicated axis.
    """
    replicated = []
    for path, var in nnx.iter_graph(module):
        if not isinstance(var, nnx.Variable) or not var.get_metadata("out_sharding", None):
            continue
        spec = tuple(var.get_metadata("out_sharding"))
        spec = spec + (None,) * (len(var.shape) - len(spec))
        fitted = fitted_spec(var.shape, spec, dict(mesh.shape))
        if fitted != spec:
            name = "/".join(map(str, path))
            axes = [
                f"{name} axis {i} ({var.shape[i]} over {a})"
                for i, (a, f) in enumerate(zip(spec, fitted, strict=True))
                if a != f
            ]
            for axis in axes:
                log.info("replicated (does not divide the mesh): %s", axis)
            replicated += axes
            var.set_metadata(out_sharding=fitted)
        if place:
            target = NamedSharding(mesh, PartitionSpec(*fitted))
            value = var[...]
            traced = isinstance(value, jax.core.Tracer)  # a model built abstractly (nnx.eval_shape) has no sharding yet
            if traced or not value.sharding.is_equivalent_to(target, len(var.shape)):
                var[...] = jax.device_put(value, target)
    return replicated
