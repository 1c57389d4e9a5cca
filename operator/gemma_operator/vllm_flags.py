"""Which vLLM flags a GemmaServe may pass in `extraArgs`: the rule the API validates and the
container's command line relies on, kept apart from both so neither imports the other."""

from __future__ import annotations

# The Service, the probes and the status endpoint depend on these, so a spec may not change them.
OWNED_FLAGS = ("model", "served-model-name", "host", "port")
# A credential on the command line is visible in the pod spec and in `ps`: it comes from a Secret.
SECRET_FLAGS = ("api-key",)


def _flag_name(arg: str) -> str | None:
    """The long option an argument sets, as vLLM's parser reads it (`_` and `-` are the same)."""
    if not arg.startswith("--"):
        return None
    return arg[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def check_extra_args(extra_args: tuple[str, ...]) -> None:
    """Refuse extra args that would set an operator-owned flag or a credential.

    argparse accepts any unambiguous prefix of a long option, so `--po=1` sets `--port` too.
    """
    for arg in extra_args:
        name = _flag_name(arg)
        if not name:
            continue
        for flag in OWNED_FLAGS:
            if flag.startswith(name):
                raise ValueError(f"extra args may not set --{flag} ({arg!r}): the operator sets it")
        for flag in SECRET_FLAGS:
            if flag.startswith(name):
                raise ValueError(f"--{flag} must come from a Secret, not from extra args ({arg!r})")
