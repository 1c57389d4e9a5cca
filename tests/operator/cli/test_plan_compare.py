"""`gemma-tpu plan --compare`: the paper's comparison, one fine-tune and its serving on a TPU shape and
on a GPU shape, priced side by side from the same plans `gemma-tpu plan` prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gemma_operator import cli

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TPU_FILES = (EXAMPLES / "gemma4-31b-v5p8.yaml", EXAMPLES / "serve-v6e8.yaml")
GPU_FILES = (EXAMPLES / "gemma4-31b-h100x2.yaml", EXAMPLES / "serve-h100x2.yaml")
# The seed paper's peak output throughput at 1024 in / 512 out: v6e-8 1,404 tokens/s, 2x H100 1,387.
STATED = ["--throughput", "verilog-assistant=1404", "--throughput", "verilog-assistant-h100=1387"]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main_exit(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def files(*paths: Path) -> list[str]:
    return [a for p in paths for a in ("-f", str(p))]


def test_the_tpu_and_gpu_examples_side_by_side(capsys):
    code, out, err = run(capsys, "--compare", "-o", "json", *files(*TPU_FILES, *GPU_FILES), *STATED)
    assert code == 0, err
    tpu, gpu = json.loads(out)
    assert (tpu["fineTune"], tpu["serve"]) == ("gemma4-31b-verilog", "verilog-assistant")
    assert (gpu["fineTune"], gpu["serve"]) == ("gemma4-31b-verilog-h100", "verilog-assistant-h100")
    assert (tpu["training"]["device"], gpu["training"]["device"]) == ("chip", "GPU")
    assert (tpu["training"]["devices"], gpu["training"]["devices"]) == (4, 2)
    assert (tpu["serving"]["devices"], gpu["serving"]["devices"]) == (8, 2)

    # The same figures as each fine-tune's and service's own plan.
    code, out, _ = run(capsys, "-o", "json", *files(*TPU_FILES, *GPU_FILES))
    plans = {(p["kind"], p["name"]): p for p in json.loads(out)}
    for col in (tpu, gpu):
        ft, sv = plans[("GemmaFineTune", col["fineTune"])], plans[("GemmaServe", col["serve"])]
        assert col["training"]["cost"] == ft["estimate"]["cost"] and col["training"]["hours"] == ft["estimate"]["hours"]
        assert col["training"]["perMillionTokens"] == pytest.approx(
            ft["estimate"]["cost"] / ft["estimate"]["tokens"] * 1e6, abs=0.01
        )
        hourly = sv["cost"]["perReplicaHour"]
        assert col["serving"]["perReplicaHour"] == hourly
        rate = col["serving"]["outputTokensPerSecond"]
        assert col["serving"]["perMillionOutputTokens"] == pytest.approx(hourly / (rate * 3600) * 1e6, abs=0.01)
        for hours in (1, 24):
            total = col["trainingPlusServing"][f"{hours}h"]
            assert total == pytest.approx(col["training"]["cost"] + hours * hourly, abs=0.01)
    # The paper's own serving rates: v6e-8 $21.52/h, a3-highgpu-2g $22.12/h.
    assert (tpu["serving"]["perReplicaHour"], gpu["serving"]["perReplicaHour"]) == (21.52, 22.12)


def test_the_text_table_has_a_column_each_and_their_ratio(capsys):
    code, out, err = run(capsys, "--compare", *files(*TPU_FILES, *GPU_FILES), *STATED)
    assert code == 0, err
    header, *rows = out.split("\n\n")[0].splitlines()
    assert header.split() == ["gemma4-31b-verilog", "gemma4-31b-verilog-h100", "second", "/", "first"]
    by_label = {r[:25].strip(): r[25:].split() for r in rows}
    assert by_label["serving on"][:2] == ["v6e-8", "(2x4)"]
    assert by_label["$ / replica-hour"] == ["$21.52", "$22.12", f"{22.12 / 21.52:.2f}x"]
    assert by_label["output tokens/s"] == ["1,404", "(stated)", "1,387", "(stated)", f"{1387 / 1404:.2f}x"]


def test_without_a_stated_throughput_the_cost_per_token_is_not_guessed(capsys):
    code, out, _ = run(capsys, "--compare", "-o", "json", *files(*TPU_FILES))
    [col] = json.loads(out)
    assert code == 0 and col["serving"]["outputTokensPerSecond"] is None
    assert col["serving"]["perMillionOutputTokens"] is None
    code, out, _ = run(capsys, "--compare", "-o", "json", "--throughput", "1000", *files(*TPU_FILES))
    assert json.loads(out)[0]["serving"]["outputTokensPerSecond"] == 1000


def test_a_fine_tune_alone_and_a_service_alone_are_columns_of_their_own(capsys):
    code, out, _ = run(
        capsys, "--compare", "-o", "json", *files(EXAMPLES / "gemma4-31b-v5p8.yaml", EXAMPLES / "serve-v6e8.yaml")
    )
    assert code == 0 and len(json.loads(out)) == 1
    code, out, _ = run(
        capsys, "--compare", "-o", "json", *files(EXAMPLES / "serve-v6e8.yaml", EXAMPLES / "gemma4-31b-v5p8-dpo.yaml")
    )
    cols = json.loads(out)
    assert code == 0 and {(c["fineTune"] is None, c["serve"] is None) for c in cols} == {(True, False), (False, True)}
    assert all(c["trainingPlusServing"] is None for c in cols)


@pytest.mark.parametrize(
    "value,message",
    [
        ("fast", "--throughput fast: not a positive number of output tokens per second"),
        ("verilog-assistant=0", "--throughput verilog-assistant=0: not a positive number"),
        ("nobody=100", "--throughput nobody=...: no GemmaServe nobody in the input"),
    ],
)
def test_a_bad_throughput_is_refused(capsys, value, message):
    code, out, err = run(capsys, "--compare", "--throughput", value, *files(*TPU_FILES))
    assert code == 2 and out == "" and err.startswith(message)
