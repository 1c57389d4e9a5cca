"""docs/gpu.md shows what `gemma-tpu plan` and `plan --compare` print for the GPU examples: the
guide's tables are the command's output, so a change of the plan or of a default shows here."""

from __future__ import annotations

import pytest
from scripts.manifests import ROOT

from gemma_operator import cli

GUIDE = (ROOT / "docs" / "gpu.md").read_text()
EXAMPLES = ROOT / "examples"
BOTH = ["gemma4-31b-v5p8.yaml", "serve-v6e8.yaml", "gemma4-31b-h100x2.yaml", "serve-h100x2.yaml"]


def printed(capsys, *args: str) -> str:
    assert cli.main_exit(["plan", *args]) == 0
    return capsys.readouterr().out.strip()


def files(*names: str) -> list[str]:
    return [a for n in names for a in ("-f", str(EXAMPLES / n))]


def test_the_guide_shows_the_plan_of_the_gpu_examples(capsys):
    assert printed(capsys, *files("gemma4-31b-h100x2.yaml", "serve-h100x2.yaml")) in GUIDE


@pytest.mark.parametrize(
    "settings,rates",
    [
        (None, ["verilog-assistant=1404", "verilog-assistant-h100=1387"]),
        ("assumed_gpu_mfu: 0.1466\n", ["verilog-assistant=1206", "verilog-assistant-h100=728"]),
    ],
    ids=["built-in settings", "the paper's GPU hours"],
)
def test_the_guide_shows_the_comparison_plan_compare_prints(capsys, tmp_path, settings, rates):
    args = ["--compare", *files(*BOTH), *(a for r in rates for a in ("--throughput", r))]
    if settings:
        (tmp_path / "settings.yaml").write_text(settings)
        args += ["--settings", str(tmp_path / "settings.yaml")]
    table = printed(capsys, *args).split("\n\n")[0]
    assert table in GUIDE
