"""The arguments of `gemma-tpu dev`, kept with the local cluster: the operator's command line only
hands them on, so the operator image needs none of this package."""

from __future__ import annotations

import argparse

from gemma_devcluster import confinement, control_plane, dev


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gemma-tpu dev", description=dev.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", default=".demo", help="where the model, data, runs and pod folders go")
    p.add_argument("--examples", default="examples/quickstart", help="the CRs to apply")
    p.add_argument(
        "--vllm-python", default=".venv-vllm/bin/python", help="python of the environment with vLLM's CPU build"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--kubeconfig",
        help="run on the API server this kubeconfig names (a control plane without nodes of its own, such as "
        "start-control-plane's; one with schedulable Nodes is refused), as an admin: the CRDs, the operator's RBAC "
        "and the local node are installed there",
    )
    where.add_argument(
        "--real",
        action="store_true",
        help=f"start a real kube-apiserver and kube-controller-manager ({control_plane.ENV} or ../shared/k8s), "
        "run on it, stop it",
    )
    where.add_argument("--port", type=int, default=0, help="port of the in-process Kubernetes API (0: any free one)")
    p.add_argument(
        confinement.ALLOW_FLAG,
        action="store_true",
        help="with --kubeconfig, run even though the cluster has schedulable Nodes and workloads of its own: the "
        "demo adds a node there (tainted, so that only its pods land on it) and runs only its own pods",
    )
    p.add_argument("--timeout", type=float, default=900, help="give up after this many seconds")
    p.add_argument("--keep-running", action="store_true", help="keep the cluster up and print a kubeconfig")
    return p


def main(argv: list[str]) -> int:
    return dev.main(build_parser().parse_args(argv))
