"""`gemma-tpu plan` on a fine-tune and its serve: what one training run plus a month of serving costs,
and the benchmark each revision gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemma_operator import cli
from gemma_operator.settings import OperatorSettings

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _plan(capsys, *files: Path, output: str = "json"):
    code = cli.main_exit(["plan", "-o", output, *(a for f in files for a in ("-f", str(f)))])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out) if output == "json" else out


def test_a_training_run_plus_thirty_days_of_serving_it(capsys):
    ft, sv = _plan(capsys, EXAMPLES / "gemma4-31b-v5p8.yaml", EXAMPLES / "serve-v6e8.yaml")
    assert ft["kind"] == "GemmaFineTune" and sv["withTraining"]["fineTune"] == ft["name"]
    run = ft["estimate"]["cost"]
    month = sv["cost"]["at"]["replicas"]["30Days"]
    at = sv["withTraining"]["at"]["replicas"]
    assert (sv["withTraining"]["trainingRun"], at["serving30Days"]) == (run, month)
    assert at["total"] == pytest.approx(run + month, abs=0.01)
    # The figures themselves: 30 days x 24 h x 8 chips x the v6e price; the run at the v5p price.
    settings = OperatorSettings()
    assert month == pytest.approx(30 * 24 * 8 * settings.prices_per_chip_hour["v6e"], abs=0.01)
    assert run > 0 and sv["benchmark"]["slo"] == {"ttftP99Ms": 3000.0, "tpotP99Ms": 100.0}
    text = _plan(capsys, EXAMPLES / "gemma4-31b-v5p8.yaml", EXAMPLES / "serve-v6e8.yaml", output="text")
    assert f"= ${at['total']:,.2f}" in text and "benchmark:     each revision once Ready: 200 prompts" in text


def test_a_serve_alone_has_no_training_cost(capsys):
    [sv] = _plan(capsys, EXAMPLES / "serve-v6e8.yaml")
    assert sv["withTraining"] is None and sv["cost"]["at"]["replicas"]["30Days"] > 0


def test_a_cpu_serve_is_priced_by_its_vcpus_as_an_estimate(capsys):
    """The cpu profile has no chip: a replica costs the vCPUs it requests at settings.price_per_vcpu_hour,
    whose built-in value is a list price the plan marks as an estimate."""
    [sv] = _plan(capsys, EXAMPLES / "quickstart" / "serve.yaml")
    settings = OperatorSettings()
    vcpus = float(settings.resources.cpu_profile_cpu)
    assert sv["cost"]["chipsPerReplica"] == vcpus
    assert sv["cost"]["perReplicaHour"] == round(vcpus * settings.price_per_vcpu_hour, 2)
    assert sv["cost"]["price"]["source"] == "settings.price_per_vcpu_hour, an estimate: set it for your nodes"
    text = _plan(capsys, EXAMPLES / "quickstart" / "serve.yaml", output="text")
    assert f"({vcpus:g} vCPUs)" in text and "an estimate" in text
