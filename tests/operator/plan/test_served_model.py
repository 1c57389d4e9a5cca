"""A GemmaServe's fineTuneRef resolves to the same model and preset for `gemma-tpu plan` and for the
live operator, the preset always the one of the fine-tune's plan."""

import pytest

from gemma_operator import cli
from gemma_operator.lifecycle import wiring
from gemma_operator.model_uri import GCS_SCHEME, HF_SCHEME, ModelUri
from gemma_operator.plan.served_model import fine_tune_plan, served_model
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve

SETTINGS = OperatorSettings()


def _succeeded(ft_obj: dict, merged: str, run: str, label: str) -> dict:
    """The fine-tune as the API server holds it once its run merged (status.model: a display label)."""
    return {**ft_obj, "status": {"phase": "Succeeded", "run": run, "model": label, "outputs": {"merged": merged}}}


@pytest.mark.parametrize(
    "model,preset",
    [
        ({"uri": "gs://models/my-checkpoint", "preset": "gemma4-31b"}, "gemma4-31b"),  # not inferable: named
        ({"hfRepo": "google/gemma-4-31B-it"}, "gemma4-31b"),  # inferred from the repository
        ({"uri": "gs://models/my-checkpoint"}, None),  # neither: the label in its status is no preset
    ],
)
def test_plan_and_the_operator_serve_the_same_model_and_preset(model, preset):
    ft = finetune("ft").set("model", model)
    sv = serve("chat").fine_tune("ft")
    plans, problems = cli.plan_documents([ft.obj(), sv.obj()], SETTINGS)
    assert problems == []
    planned = dict(plans)
    ft_plan, offline = planned["GemmaFineTune"], planned["GemmaServe"]
    observed = _succeeded(ft.obj(), ft_plan.merged_dir, ft_plan.run, ft_plan.model_label)

    live, live_problems = wiring.serve_plan(sv.obj(), "ft", observed, SETTINGS)

    assert live_problems == []
    assert (live.model_uri, live.preset) == (offline.model_uri, offline.preset) == (ft_plan.merged_dir, preset)


def test_a_fine_tune_not_yet_merged_gives_its_preset_but_no_model_live():
    ft = finetune("ft").set("model", {"uri": "gs://models/my-checkpoint", "preset": "gemma4-31b"})
    source = served_model(serve("chat").fine_tune("ft").spec, fine_tune_plan(ft.obj(), SETTINGS), ft.obj())
    assert (source.uri, source.preset, source.run) == (None, "gemma4-31b", None)


def test_a_fine_tune_with_an_invalid_spec_has_no_plan():
    assert fine_tune_plan(finetune("ft").tpu("v5p", "9x9x9").obj(), SETTINGS) is None


def test_model_uris_parse_to_their_scheme_and_back():
    # hf:// and gs:// as the workloads read them (gemma_workloads.sources); anything else is a mounted path.
    for text, scheme, location in [
        ("hf://google/gemma-4-31B-it", HF_SCHEME, "google/gemma-4-31B-it"),
        ("gs://bucket/model", GCS_SCHEME, "bucket/model"),
        ("/data/model", "", "/data/model"),
    ]:
        uri = ModelUri.parse(text)
        assert (uri.scheme, uri.location, str(uri), uri.staged) == (scheme, location, text, bool(scheme))
