"""`gemma-tpu`: run the operator, or show what it would do without a cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from gemma_operator import api, crd


def _dump_all(objects: list[dict]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)


def cmd_crds(args: argparse.Namespace) -> int:
    """Print the CRDs, or write one file per CRD into --out."""
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for kind in api.KINDS.values():
            (out / crd.crd_filename(kind)).write_text(_dump_all([crd.crd(kind)]))
        return 0
    sys.stdout.write(_dump_all(crd.all_crds()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gemma-tpu", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("crds", help="print the CustomResourceDefinitions")
    p.add_argument("--out", help="write one YAML file per CRD into this directory")
    p.set_defaults(func=cmd_crds)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
