"""`gemma-tpu render` refuses everything a real kube-apiserver 1.36 refuses: a GitOps gate that passes
what the cluster then refuses is worse than none. The corpus (tests/support/admission_corpus.py) is
generated from the CRDs' own schemas; each case goes to the real server as `kubectl apply` sends it
(server-side dry run, strict field validation) and to `gemma-tpu render` as a file. Cases that the
project refuses and the server takes are allowed only where JUSTIFIED says why."""

from __future__ import annotations

import contextlib
import io
import json
import re
import urllib.parse
from collections import Counter
from pathlib import Path

import kmock
import kubernetes
import pytest
import yaml
from kubernetes.client.rest import ApiException

from gemma_devcluster.apiserver import ApiServer
from gemma_operator import api, cli, kube_yaml
from gemma_operator import api as api_
from gemma_operator.kube import ApiError, Kube
from tests.support.admission_corpus import CEL_CASES, Case, bases, corpus, crd_rule_messages, with_values

# The project refuses and the server takes: what render says (a pattern), and why refusing is right. Each is
# a rule about more than the object (the TPU and GPU catalogues, the model, the cluster's settings), which the
# schema cannot state; the operator refuses the same in the CR's status (InvalidSpec), before any pod.
JUSTIFIED: dict[str, str] = {
    r"spec\.tpu\.topology: v\d\w* has no topology": "the slices of each TPU generation are the catalogue's (tpu.py)",
    r"spec\.training\.mesh: fsdp \d+ x tp \d+ = \d+ devices, but": "the mesh must cover the slice's chips (catalogue)",
    r"does not fit .* for (serving|training)": "the HBM fit needs the model's shapes and the chip's or GPU's memory (fit.py)",
    r"is too short for \S+: loading and XLA compilation": "the start-up time is the model's, which the schema does not know",
    r"above this cluster's limit: .*operator setting": "the cluster's limits are operator settings, not the CRD's",
    r"is not under spec\.storage\.mountPath": "a local path must lie under the mounted volume, compared as normalised paths",
}


def as_kubectl_sends(value):
    """The JSON kubectl sends for a YAML value: sigs.k8s.io/yaml turns YAML into JSON through Go's
    encoding/json, which writes a whole float64 without a fraction (`0.0` goes as `0`, `200.0` as `200`)."""
    if isinstance(value, dict):
        return {k: as_kubectl_sends(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_kubectl_sends(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    return value


def server_refusal(client, doc: dict, namespace: str) -> str | None:
    """None when the server would create the object, else its message."""
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    target = meta.get("namespace") if isinstance(meta.get("namespace"), str) else namespace
    kind = api.KINDS[doc["kind"]]
    try:
        kubernetes.client.CustomObjectsApi(client).create_namespaced_custom_object(
            api.GROUP, api.VERSION, target, kind.plural, as_kubectl_sends(doc), dry_run="All", field_validation="Strict"
        )
    except ApiException as e:
        return f"{e.status}: {e.body}"
    return None


def render_refusal(doc: dict, path: Path) -> str | None:
    """None when `gemma-tpu render -f FILE` renders the object, else what it printed on stderr. The file is
    the JSON the server gets (JSON is YAML, every string quoted), so that render reads the same values."""
    path.write_text(json.dumps(doc, ensure_ascii=False))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main_exit(["render", "-f", str(path)])
    assert code in (0, cli.EXIT_INVALID), err.getvalue()
    return err.getvalue().strip() or "refused" if code else None


def placed(case: Case, namespace: str) -> dict:
    """The case's object in the test's namespace, unless the case is about the namespace itself."""
    doc = case.doc
    if "namespace" not in case.id and isinstance(doc.get("metadata"), dict):
        doc = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    return doc


def test_every_cel_rule_of_the_crds_has_cases():
    assert set(CEL_CASES) == crd_rule_messages()


@pytest.fixture(scope="module")
def verdicts(control_plane, tmp_path_factory):
    namespace = f"parity-{tmp_path_factory.getbasetemp().name[-6:].lower().replace('_', '-')}"
    control_plane.create_namespace(namespace)
    path = tmp_path_factory.mktemp("parity") / "case.yaml"
    cases = corpus(lambda doc: render_refusal(placed(Case("", doc), namespace), path) is None)
    with control_plane.client() as client:
        return [
            (
                case,
                server_refusal(client, placed(case, namespace), namespace),
                render_refusal(placed(case, namespace), path),
            )
            for case in cases
        ]


def test_the_corpus_is_large_and_exercises_both_answers(verdicts):
    outcomes = Counter((server is None, project is None) for _, server, project in verdicts)
    print(
        f"\n{len(verdicts)} cases: both accept {outcomes[True, True]}, both refuse {outcomes[False, False]}, "
        f"only the project refuses {outcomes[True, False]}, only the server refuses {outcomes[False, True]}"
    )
    assert len(verdicts) >= 300
    assert outcomes[True, True] >= 100 and outcomes[False, False] >= 100


def test_the_project_refuses_everything_the_server_refuses(verdicts):
    missed = [f"{case.id}\n    server: {server[:300]}" for case, server, project in verdicts if server and not project]
    assert not missed, f"{len(missed)} cases the server refuses and render accepts:\n" + "\n".join(missed)


def test_what_only_the_project_refuses_is_justified(verdicts):
    only_project = [(case, project) for case, server, project in verdicts if project and not server]
    unjustified = [
        f"{case.id}\n    render: {project[:300]}"
        for case, project in only_project
        if not any(re.search(pattern, project) for pattern in JUSTIFIED)
    ]
    assert not unjustified, f"{len(unjustified)} cases render refuses and the server takes:\n" + "\n".join(unjustified)
    print(f"\n{len(only_project)} cases only the project refuses, each for a reason in JUSTIFIED:")
    for case, project in only_project:
        print(f"  {case.id}: {next(why for pattern, why in JUSTIFIED.items() if re.search(pattern, project))}")


@pytest.mark.parametrize(
    ("path", "value"),
    [("spec.preference.labelSmoothing", 0.0), ("spec.training.steps", 200.0), ("spec.training.seed", 2**63)],
    ids=["zero written 0.0", "whole number written 200.0", "beyond int64"],
)
def test_kubectl_sends_what_the_corpus_sends(control_plane, namespace, tmp_path, path, value):
    """The corpus stands for `kubectl apply`: kubectl itself gets the same answer for the numbers whose
    encoding matters (a whole float sent as an integer, an integer past int64)."""
    doc = placed(Case("", with_values(bases()["GemmaFineTune"]["dpo"], {path: value})), namespace)
    (tmp_path / "cr.yaml").write_text(yaml.safe_dump(doc))
    done = control_plane.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", str(tmp_path / "cr.yaml"), check=False
    )
    with control_plane.client() as client:
        ours = server_refusal(client, doc, namespace)
    assert (done.returncode == 0) == (ours is None), (done.stderr, ours)
    assert (ours is None) == (render_refusal(doc, tmp_path / "render.yaml") is None)


async def test_the_in_process_api_admits_every_case_as_the_real_one(verdicts):
    """The in-process API of the fast tests and `make demo` (gemma_devcluster.apiserver) answers the whole
    corpus as kube-apiserver 1.36 did: it checks what the server checks, without a CEL engine, through the
    models that hold the same cross-field rules as the CRD's CEL."""
    async with ApiServer() as api, kmock.Server(api):
        api.register_defaults()
        kube = Kube.from_url(str(api.url))
        differ = []
        for case, server, _ in verdicts:
            doc = as_kubectl_sends(placed(case, "parity"))
            meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
            target = meta.get("namespace") if isinstance(meta.get("namespace"), str) else "parity"
            where = urllib.parse.quote(target, safe="")  # a newline in a namespace goes in the path as %0A
            path = f"/apis/{api_.GROUP}/{api_.VERSION}/namespaces/{where}/{api_.KINDS[doc['kind']].plural}"
            try:
                await kube._call("POST", path, body=doc, query={"dryRun": "All", "fieldValidation": "Strict"})
                ours = None
            except ApiError as e:
                ours = f"{e.status}: {e.message}"
            if (ours is None) != (server is None):
                differ.append(f"{case.id}\n    real: {server and server[:200]}\n    in-process: {ours and ours[:200]}")
    assert not differ, f"{len(differ)} cases the two API servers answer differently:\n" + "\n".join(differ)


# Scalars that YAML 1.1 (PyYAML) and kubectl's goyaml.v2 read differently, or that Go's integer syntax
# decides, each as a file would have it: `seed: 0o10` is 8 to kubectl, `team: y` is true, `1:20` a string.
YAML_SCALARS = [
    "0o10",
    "-0o10",
    "0O10",
    "010",
    "08",
    "09",
    "0x1F",
    "0X1f",
    "0b101",
    "-0b11",
    "0B1",
    "1_000",
    "1__0",
    "+5",
    "-0",
    "1e3",
    "1E+2",
    "0.",
    ".5",
    "-.5",
    "1:20",
    "12:30:00",
    "0o8",
    "0x",
    "_1",
    "99999999999999999999",
    "0xFFFFFFFFFFFFFFFFFF",
    "9223372036854775808",
    "y",
    "Y",
    "n",
    "N",
    "yes",
    "No",
    "on",
    "OFF",
    "true",
    "~",
    "null",
    "2001-12-14",
    "2001-12-14T10:00:00Z",
] + ["'0o10'", "!!int 0o10", "!!float 3", "!!str 08", "!!binary aGk="]


def as_float64(value):
    """A number past 2^53 as the float64 the server decodes it to (Go writes 2^63 as 9223372036854776000)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > 2**53:
        return float(value)
    return value


def test_render_reads_yaml_as_kubectl_sends_it(control_plane, tmp_path):
    """Every scalar of YAML_SCALARS in one file: what kubectl 1.32 would send (its client-side dry run prints
    the JSON) is what render reads, once whole floats go as integers (Go's encoding/json writes them so)."""
    fields = "\n".join(f"  v{i}: {text}" for i, text in enumerate(YAML_SCALARS))
    text = f"apiVersion: {api.API_VERSION}\nkind: GemmaFineTune\nmetadata:\n  name: scalars\nspec:\n{fields}\n"
    (tmp_path / "scalars.yaml").write_text(text)
    done = control_plane.kubectl(
        "create", "--dry-run=client", "--validate=false", "-o", "json", "-f", str(tmp_path / "scalars.yaml")
    )
    sent = {k: as_float64(v) for k, v in json.loads(done.stdout)["spec"].items()}
    read = {k: as_float64(v) for k, v in as_kubectl_sends(kube_yaml.load_all(text)[0]["spec"]).items()}
    differ = {YAML_SCALARS[int(k[1:])]: (sent.get(k), read.get(k)) for k in sent.keys() | read.keys()}
    assert {t: v for t, v in differ.items() if v[0] != v[1] or type(v[0]) is not type(v[1])} == {}


def test_what_kubectl_cannot_send_render_refuses(control_plane, tmp_path):
    """An infinity has no JSON form: kubectl refuses the file, and so does render, in kubectl's words."""
    doc = bases()["GemmaFineTune"]["quickstart"]
    text = yaml.safe_dump(doc).replace("learningRate: 0.01", "learningRate: .inf")
    assert ".inf" in text
    (tmp_path / "inf.yaml").write_text(text)
    done = control_plane.kubectl(
        "create", "--dry-run=client", "-o", "json", "-f", str(tmp_path / "inf.yaml"), check=False
    )
    assert done.returncode != 0 and "error converting YAML to JSON" in done.stderr, done.stderr
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main_exit(["render", "-f", str(tmp_path / "inf.yaml")])
    assert code == cli.EXIT_INVALID and "error converting YAML to JSON" in err.getvalue() and not out.getvalue()
