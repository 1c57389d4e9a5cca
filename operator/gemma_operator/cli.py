"""`gemma-tpu`: run the operator, or show what it would do without a cluster.

render  every object the operator would create for the CRs in a file (exit 2 on a bad spec)
plan    the derived plan: slice, mesh, HBM fit, duration and cost (exit 2 when it cannot fit)
crds    the CustomResourceDefinitions
operator  run the controller (kopf) against the current cluster
dev     the whole pipeline on this machine (what `make demo` runs; the package gemma_devcluster)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from gemma_operator import api, crd, plan_text
from gemma_operator.children import merge_objects, serving_objects, training_objects
from gemma_operator.plan import SpecError, plan_finetune, plan_serve
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


def _load_crs(paths: list[str]) -> list[dict[str, Any]]:
    """Every document of the given files, directories (their *.yaml, *.yml) or stdin ('-')."""
    docs = []
    for path in paths:
        if path == "-":
            texts = [sys.stdin.read()]
        elif Path(path).is_dir():
            texts = [f.read_text() for f in sorted(Path(path).iterdir()) if f.suffix in (".yaml", ".yml")]
        else:
            texts = [Path(path).read_text()]
        docs += [doc for text in texts for doc in yaml.safe_load_all(text) if doc]
    return docs


def _identify(doc: dict) -> tuple[str, str, str]:
    """(kind, name, namespace) of a CR, or SpecError naming what is missing."""
    kind, meta = doc.get("kind"), doc.get("metadata") or {}
    problems = []
    if doc.get("apiVersion") != api.API_VERSION or kind not in api.KINDS:
        problems.append(f"{kind or '?'}: not a {api.API_VERSION} GemmaFineTune or GemmaServe")
    if not meta.get("name"):
        problems.append(f"{kind or '?'}: metadata.name is required")
    if problems:
        raise SpecError(problems)
    return kind, meta["name"], meta.get("namespace") or "default"


def plan_documents(docs: list[dict], settings) -> tuple[list[tuple[str, Any]], list[str]]:
    """Plan every CR of a file; a GemmaServe's fineTuneRef resolves to a fine-tune of the same file."""
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
        labels = (doc.get("metadata") or {}).get("labels") or {}
        if kind == api.FINETUNE.kind:
            try:
                p = plan_finetune(name, namespace, doc.get("spec"), settings, labels)
                finetunes[(namespace, name)] = p
                plans.append((kind, p))
            except SpecError as e:
                problems += [f"{kind}/{name}: {m}" for m in e.problems]
        else:
            serves.append((name, namespace, doc, labels))
    for name, namespace, doc, labels in serves:
        try:
            ref = ((doc.get("spec") or {}).get("model") or {}).get("fineTuneRef")
            uri, preset = None, None
            if ref:
                ft = finetunes.get((namespace, ref.get("name")))
                if ft is None:
                    raise SpecError(
                        [
                            f"spec.model.fineTuneRef: GemmaFineTune {ref.get('name')!r} is not in this file, so its output is unknown"
                        ]
                    )
                uri, preset = ft.merged_dir, ft.preset
            plans.append(
                (
                    "GemmaServe",
                    plan_serve(
                        name,
                        namespace,
                        doc.get("spec"),
                        settings,
                        model_uri=uri,
                        fine_tune_preset=preset,
                        labels=labels,
                    ),
                )
            )
        except SpecError as e:
            problems += [f"GemmaServe/{name}: {m}" for m in e.problems]
    return plans, problems


def _fail(problems: list[str]) -> int:
    for line in problems:
        print(line, file=sys.stderr)
    return EXIT_INVALID


def _plan_files(args: argparse.Namespace) -> tuple[list[tuple[str, Any]], Any, list[str]]:
    """(plans, settings, problems) for the files named on the command line."""
    try:
        docs = _load_crs(args.file)
    except (OSError, yaml.YAMLError) as e:
        return [], None, [f"{' '.join(args.file)}: {e}"]
    settings = load_settings(args.settings)
    plans, problems = plan_documents(docs, settings)
    return plans, settings, problems


def cmd_render(args: argparse.Namespace) -> int:
    plans, settings, problems = _plan_files(args)
    if problems:
        return _fail(problems)
    objects: list[dict] = []
    for kind, p in plans:
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
    if args.output == "json":
        print(json.dumps([plan_text.as_dict(p) for _, p in plans], indent=2))
    else:
        print("\n\n".join(plan_text.as_text(p) for _, p in plans))
    return 0


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

    p = sub.add_parser("plan", help="print the derived plan, refuse specs that cannot fit")
    p.add_argument("-f", "--file", required=True, action="append", help="file or directory of CRs; repeatable")
    p.add_argument("--settings")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p.set_defaults(func=cmd_plan)

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
