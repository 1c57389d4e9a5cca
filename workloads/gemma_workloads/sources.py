"""Where a base model comes from: a path, gs://, or a Hugging Face repository (`hf://org/name`).

A repository is downloaded once into the Hugging Face cache ($HF_HOME; on a TPU host the
training pod points it at a staging disk sized for the model) with the token from $HF_TOKEN,
which the operator fills from a Secret; only the files a Gemma 4 checkpoint is made of are fetched.
"""

from __future__ import annotations

import os

from gemma_workloads.input_files import InputError

HF_PREFIX = "hf://"
CHECKPOINT_FILES = ["*.safetensors", "*.json", "*.jinja", "tokenizer*"]
SMALL_FILES = [p for p in CHECKPOINT_FILES if p != "*.safetensors"]  # what is checked before the weights come


class ModelSourceError(InputError):
    """The model cannot be found or is not allowed: bad input, not worth a retry."""


def resolve_model(path: str, patterns: list[str] = CHECKPOINT_FILES) -> str:
    """A path the loaders read (local or gs://) for any model source; of a repository, only the
    files matching `patterns` are fetched."""
    if not path.startswith(HF_PREFIX):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    repo = path.removeprefix(HF_PREFIX)
    try:
        return snapshot_download(repo, allow_patterns=patterns, token=os.environ.get("HF_TOKEN") or None)
    except GatedRepoError:
        raise ModelSourceError(
            f"{repo} is gated: accept its licence on Hugging Face and give a token (spec.model.hfTokenSecretRef)"
        ) from None
    except RepositoryNotFoundError:
        raise ModelSourceError(f"{repo}: no such Hugging Face repository (or no access with the given token)") from None
    except LocalEntryNotFoundError as e:
        raise ModelSourceError(f"{repo} is not in the Hugging Face cache and cannot be downloaded: {e}") from None
