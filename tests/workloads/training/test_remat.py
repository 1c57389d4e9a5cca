"""Every remat policy gives the gradients of no remat; each one but "none" rematerialises every
decoder layer."""

import copy

import jax
import pydantic
import pytest
from flax import nnx

from gemma_workloads.config import REMAT_POLICIES, TrainConfig
from gemma_workloads.training import attention, batches, loss, remat
from tests.workloads.training.tiny_lora import assert_close, lora_grads, packed_batch, random_lora_model

POLICIES = [
    p
    if p != "offload"
    else pytest.param(
        p, marks=pytest.mark.skipif(not remat.offload_supported(), reason="no pinned host memory on this platform")
    )
    for p in REMAT_POLICIES
]


@pytest.fixture(scope="module")
def reference():
    model = random_lora_model("float32")
    attention.use_attention(model, "xla")  # names its output, which "dots" keeps
    batch = packed_batch()
    return model, batch, lora_grads(model, loss.token_weighted_nll, batch)


@pytest.mark.parametrize("policy", POLICIES)
def test_remat_policies_give_the_same_gradients(reference, policy):
    model, batch, (want_loss, want_grads) = reference
    model = copy.deepcopy(model)
    remat.use_remat(model, policy)
    inputs = batches.model_inputs(batch)
    grad = nnx.value_and_grad(lambda m: loss.token_weighted_nll(m, **inputs), argnums=nnx.DiffState(0, nnx.LoRAParam))
    assert str(jax.make_jaxpr(grad)(model)).count("remat") == (0 if policy == "none" else len(model.layers))
    got_loss, got_grads = lora_grads(model, loss.token_weighted_nll, batch)
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    for got, want in zip(got_grads, want_grads, strict=True):
        assert_close(got, want, "float32")


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="expected one of"):
        remat.policy("some")


def test_the_config_names_the_policy_in_force():
    base = dict(model_path="m", dataset=dict(path="d"), output_dir="o")
    assert TrainConfig(**base).remat == "full"
    assert TrainConfig(**base, gradient_checkpointing=False).remat == "none"
    assert TrainConfig(**base, remat_policy="dots").remat == "dots"
    with pytest.raises(pydantic.ValidationError, match="remat_policy"):
        TrainConfig(**base, remat_policy="some")
    with pytest.raises(pydantic.ValidationError, match="attention"):
        TrainConfig(**base, attention="flash")
