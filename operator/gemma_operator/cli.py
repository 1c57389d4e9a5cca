"""`gemma-tpu`: run the operator, or show what it would do without a cluster.

render  every object the operator would create for the CRs in a file (exit 2 on a bad spec)
plan    the derived plan: slice or GPUs, mesh, HBM fit, duration and cost (exit 2 when it cannot fit or
        the API server would refuse it); a CI gate over a GitOps folder or `kustomize build` output:
        the objects of other API groups are skipped, one line each on stderr. With --compare, the
        fine-tunes and services of the input priced side by side (a TPU shape and a GPU shape)
crds    the CustomResourceDefinitions
operator  run the controller (kopf) against the current cluster
dev     the whole pipeline on this machine (what `make demo` runs; the package gemma_devcluster)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gemma_operator import api, crd, crd_validation, kube_yaml, object_meta, plan_compare, plan_text
from gemma_operator.children import merge_objects, serving_objects, training_objects
from gemma_operator.plan import ServePlan, SpecError, plan_finetune, plan_serve
from gemma_operator.plan.served_model import served_model
from gemma_operator.settings import load_settings

EXIT_INVALID = 2


class _Dumper(yaml.SafeDumper):
    """Readable manifests: multi-line strings (the workload configs) as blocks, number lists inline,
    and every object written out in full: PyYAML writes an object met twice (a securityContext
    shared by two containers) as an anchor and aliases (`&id001`, `*id001`), which a reader, a diff
    or a tool that edits the YAML does not expect of a manifest."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _list(dumper: yaml.SafeDumper, value: list) -> yaml.Node:
    flow = bool(value) and all(isinstance(v, int) for v in value)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)


_Dumper.add_representer(str, _str)
_Dumper.add_representer(list, _list)


def dump_all(objects: list[dict]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def _load_crs(paths: list[str]) -> list[Any]:
    """Every document of the given files, directories (their *.yaml, *.yml) or stdin ('-'), with the
    items of a `kind: List` (what `kubectl get -o yaml` writes) as documents of their own."""
    docs: list[Any] = []
    for path in paths:
        if path == "-":
            texts = [sys.stdin.read()]
        elif Path(path).is_dir():
            texts = [f.read_text() for f in sorted(Path(path).iterdir()) if f.suffix in (".yaml", ".yml")]
        else:
            texts = [Path(path).read_text()]
        for doc in (doc for text in texts for doc in kube_yaml.load_all(text) if doc):
            is_list = isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list)
            docs += doc["items"] if is_list else [doc]
    return docs


def ours(docs: list[Any]) -> tuple[list[Any], list[str]]:
    """(the documents of this API group, one line for each other object): a GitOps folder also holds
    ServiceAccounts, Secrets and a Kustomization, which are none of the gate's business."""
    mine, skipped = [], []
    for doc in docs:
        api_version = str(doc.get("apiVersion") or "") if isinstance(doc, dict) else ""
        if not api_version or api_version.split("/")[0] == api.GROUP:
            mine.append(doc)  # ours, or not an object at all: _identify names what is wrong
            continue
        meta = doc.get("metadata") or {}
        where = "/".join(x for x in (meta.get("namespace"), meta.get("name")) if x) or "(no name)"
        skipped.append(f"skipped {api_version} {doc.get('kind') or '?'} {where}: not a {api.GROUP} object")
    return mine, skipped


def _shown(name: Any) -> str:
    """A name as a problem line shows it: quoted when it holds a newline or another unprintable character."""
    return name if isinstance(name, str) and name.isprintable() else repr(name)


def _identify(doc: Any) -> tuple[str, str, str]:
    """(kind, name, namespace) of a CR, or SpecError naming what is missing."""
    if not isinstance(doc, dict):
        raise SpecError([f"{str(doc)[:40]!r}: not a Kubernetes object"])
    kind, meta = doc.get("kind"), doc.get("metadata") or {}
    meta = meta if isinstance(meta, dict) else {}
    problems = []
    if doc.get("apiVersion") != api.API_VERSION or kind not in api.KINDS:
        problems.append(
            f"{doc.get('apiVersion') or '?'} {kind or '?'}: not a {api.API_VERSION} GemmaFineTune or GemmaServe"
        )
    name = object_meta.effective_name(meta)
    if not name:
        problems.append(f"{kind or '?'}: metadata.name or metadata.generateName is required")
    else:
        problems += [f"{kind or '?'}/{_shown(name)}: {m}" for m in object_meta.name_problems(name)]
    if problems:
        raise SpecError(problems)
    return str(kind), str(name), meta.get("namespace") or "default"


GENERATED_NAME = (
    "metadata.generateName: the API server names it {prefix!r} and 5 random characters, written "
    f"{object_meta.GENERATED_STAND_IN!r} here"
)
UNKNOWN_FINE_TUNE = (
    "spec.model.fineTuneRef: GemmaFineTune {name!r} is not in the input, so its output is unknown: planned "
    "without it (the model served is known once that fine-tune succeeds; the HBM fit is checked only with "
    "spec.model.preset)"
)


def plan_documents(docs: list[Any], settings) -> tuple[list[tuple[str, Any]], list[str]]:
    """Plan every CR, each first checked against its CRD schema as the API server would; a
    GemmaServe's fineTuneRef resolves to a fine-tune of the same input, else is planned unknown."""
    plans: list[tuple[str, Any]] = []
    problems: list[str] = []
    finetunes: dict[tuple[str, str], Any] = {}
    serves = []
    for doc in docs:
        try:
            kind, name, namespace = _identify(doc)
        except SpecError as e:
            problems += e.problems
            continue
        if refused := object_meta.problems(doc) + crd_validation.spec_problems(kind, doc.get("spec")):
            problems += [f"{kind}/{_shown(name)}: {m}" for m in refused]
            continue
        doc = {**doc, "spec": crd_validation.without_nulls(doc["spec"])}
        labels = (doc.get("metadata") or {}).get("labels") or {}
        if kind == api.FINETUNE.kind:
            try:
                p = _generated(plan_finetune(name, namespace, doc["spec"], settings, labels), doc)
                finetunes[(namespace, name)] = p
                plans.append((kind, p))
            except SpecError as e:
                problems += [f"{kind}/{name}: {m}" for m in e.problems]
        else:
            serves.append((name, namespace, doc, labels))
    for name, namespace, doc, labels in serves:
        ref = doc["spec"].get("model", {}).get("fineTuneRef")
        ft = finetunes.get((namespace, ref.get("name"))) if ref else None
        source = served_model(doc["spec"], ft)
        try:
            sp = plan_serve(
                name,
                namespace,
                doc["spec"],
                settings,
                model_uri=source.uri,
                fine_tune_preset=source.preset,
                labels=labels,
            )
        except SpecError as e:
            problems += [f"GemmaServe/{name}: {m}" for m in e.problems]
            continue
        if ref and ft is None:
            sp = replace(sp, warnings=(UNKNOWN_FINE_TUNE.format(name=ref.get("name")), *sp.warnings))
        plans.append(("GemmaServe", _generated(sp, doc)))
    return plans, problems


def _generated(p: Any, doc: dict) -> Any:
    """The plan of a CR named by the server from its generateName says so."""
    meta = doc.get("metadata") or {}
    if meta.get("name"):
        return p
    return replace(p, warnings=(GENERATED_NAME.format(prefix=meta["generateName"]), *p.warnings))


def _fail(problems: list[str]) -> int:
    for line in problems:
        print(line, file=sys.stderr)
    return EXIT_INVALID


def _plan_files(args: argparse.Namespace) -> tuple[list[tuple[str, Any]], Any, list[str]]:
    """(plans, settings, problems) for the files named on the command line; the objects of other
    API groups are skipped, one line each on stderr."""
    try:
        docs, skipped = ours(_load_crs(args.file))
    except (OSError, yaml.YAMLError) as e:
        return [], None, [f"{' '.join(args.file)}: {e}"]
    for line in skipped:
        print(line, file=sys.stderr)
    settings = load_settings(args.settings)
    plans, problems = plan_documents(docs, settings)
    return plans, settings, problems


def cmd_render(args: argparse.Namespace) -> int:
    plans, settings, problems = _plan_files(args)
    if problems:
        return _fail(problems)
    objects: list[dict] = []
    for kind, p in plans:
        for warning in p.warnings:
            print(f"{kind}/{p.name}: warning: {warning}", file=sys.stderr)
        if kind == api.FINETUNE.kind:
            objects += merge_objects(p, settings) if args.phase == "merge" else training_objects(p, settings)
        elif args.phase != "merge":
            objects += serving_objects(p, settings)
    sys.stdout.write(dump_all(objects))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    plans, _, problems = _plan_files(args)
    if problems:
        return _fail(problems)
    if args.compare:
        return _compare([p for _, p in plans], args)
    fine_tunes = {(p.namespace, p.name): p for kind, p in plans if kind == api.FINETUNE.kind}
    served = [(p, fine_tunes.get((p.namespace, _served_fine_tune(p)))) for _, p in plans]
    if args.output == "json":
        print(json.dumps([plan_text.as_dict(p, ft) for p, ft in served], indent=2))
    else:
        print("\n\n".join(plan_text.as_text(p, ft) for p, ft in served))
    return 0


def throughputs(given: list[str]) -> tuple[dict[str | None, float], list[str]]:
    """--throughput values: NAME=TOKENS_PER_SECOND for the GemmaServe NAME, or a bare number for every
    service; (the rates, one problem per value that is neither)."""
    rates: dict[str | None, float] = {}
    problems = []
    for value in given:
        name, _, number = value.rpartition("=")
        try:
            rate = float(number)
        except ValueError:
            rate = 0.0
        if not rate > 0:
            problems.append(
                f"--throughput {value}: not a positive number of output tokens per second, "
                "as NAME=TOKENS_PER_SECOND (a GemmaServe's name) or TOKENS_PER_SECOND (every service)"
            )
            continue
        rates[name or None] = rate
    return rates, problems


def _compare(plans: list[Any], args: argparse.Namespace) -> int:
    rates, problems = throughputs(args.throughput)
    unknown = sorted(n for n in rates if n is not None and n not in {p.name for p in plans if isinstance(p, ServePlan)})
    problems += [f"--throughput {n}=...: no GemmaServe {n} in the input" for n in unknown]
    if problems:
        return _fail(problems)
    cols = plan_compare.columns(plans, rates)
    if args.output == "json":
        print(json.dumps([plan_compare.as_dict(c) for c in cols], indent=2))
    else:
        print(plan_compare.as_text(cols))
    return 0


def _served_fine_tune(p: Any) -> str | None:
    """The GemmaFineTune a GemmaServe plan serves (None for a fine-tune's own plan)."""
    ref = p.spec.model.fine_tune_ref if isinstance(p, ServePlan) else None
    return ref.name if ref else None


def cmd_crds(args: argparse.Namespace) -> int:
    """Print the CRDs, or write one file per CRD into --out."""
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for kind in api.KINDS.values():
            (out / crd.crd_filename(kind)).write_text(dump_all([crd.crd(kind)]))
        return 0
    sys.stdout.write(dump_all(crd.all_crds()))
    return 0


def cmd_operator(args: argparse.Namespace) -> int:
    from gemma_operator import runner

    return runner.run(args)


# Subcommands other packages register (pyproject's entry points): `dev` is the local cluster's.
COMMANDS = "gemma_tpu.commands"
DEV_MISSING = (
    "gemma-tpu dev: the local cluster is not installed here ({missing}); the operator image leaves it "
    "out. From a checkout: `make venv`, or pip install -e '.[operator,workloads,dev]'"
)
DEV_MODULES = ("gemma_devcluster", "gemma_workloads", "kmock", "jsonpatch", "jsonschema")


def cmd_dev(args: argparse.Namespace) -> int:
    try:
        command = next(iter(importlib.metadata.entry_points(group=COMMANDS, name="dev"))).load()
    except StopIteration:
        print(DEV_MISSING.format(missing=f"no `dev` in the {COMMANDS} entry points"), file=sys.stderr)
        return EXIT_INVALID
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] not in DEV_MODULES:
            raise
        print(DEV_MISSING.format(missing=f"no module {e.name}"), file=sys.stderr)
        return EXIT_INVALID
    return command(args.dev_args)


def _add_plan(sub: Any) -> None:
    """The `plan` subcommand and its options."""
    p = sub.add_parser("plan", help="print the derived plan, refuse specs that cannot fit")
    p.add_argument(
        "-f", "--file", required=True, action="append", help="file or directory of CRs ('-': stdin); repeatable"
    )
    p.add_argument("--settings")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p.add_argument(
        "--compare",
        action="store_true",
        help="price the fine-tunes and services of the input side by side (e.g. a TPU and a GPU shape)",
    )
    p.add_argument(
        "--throughput",
        action="append",
        default=[],
        metavar="[SERVE=]TOKENS_PER_S",
        help="with --compare: output tokens/s of one replica of a GemmaServe (or of every one), "
        "for its $ per 1M output tokens; repeatable",
    )
    p.set_defaults(func=cmd_plan)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gemma-tpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("render", help="print the objects the operator would create")
    p.add_argument(
        "-f", "--file", required=True, action="append", help="file or directory of CRs ('-': stdin); repeatable"
    )
    p.add_argument("--phase", choices=["train", "merge"], default="train", help="which fine-tune phase to render")
    p.add_argument("--settings", help="operator settings YAML (default: $GEMMA_TPU_SETTINGS or built-in)")
    p.set_defaults(func=cmd_render)

    _add_plan(sub)

    p = sub.add_parser("crds", help="print the CustomResourceDefinitions")
    p.add_argument("--out", help="write one YAML file per CRD into this directory")
    p.set_defaults(func=cmd_crds)

    p = sub.add_parser("operator", help="run the operator")
    p.add_argument("--settings")
    p.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="kopf health endpoint ('' to disable)")
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0 to disable)")
    p.add_argument(
        "--metrics-address",
        default="0.0.0.0",
        help="address the metrics server binds (default every interface; 127.0.0.1 behind a proxy sidecar)",
    )
    p.add_argument("--standalone", action="store_true", help="no kopf peering (the default; kept for old scripts)")
    p.add_argument("--peering", metavar="NAME", help="opt in to kopf peering by this name (needs its CRDs)")
    p.add_argument(
        "--leader-election-lease",
        metavar="NAMESPACE/NAME",
        help="lead through this Lease before starting (several replicas, without --peering)",
    )
    p.set_defaults(func=cmd_operator)

    # Its arguments belong to the package that registers it (gemma_devcluster), which parses them.
    p = sub.add_parser(
        "dev", add_help=False, help="run the whole pipeline locally: API, operator, node agent, tiny model"
    )
    p.set_defaults(func=cmd_dev)
    return parser


def main_exit(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "dev":
        args.dev_args = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args)


def main(argv: list[str] | None = None) -> None:
    sys.exit(main_exit(argv))


if __name__ == "__main__":
    main()
