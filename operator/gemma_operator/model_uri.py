"""Where a model lies: a Hugging Face repository (hf://owner/name), a Cloud Storage path (gs://...)
or a path the pods mount. One parsed value, so that no caller splits the scheme off a string."""

from __future__ import annotations

from dataclasses import dataclass

HF_SCHEME = "hf"  # downloaded from the Hugging Face Hub (HF_TOKEN for a gated repository)
GCS_SCHEME = "gs"  # read through Cloud Storage FUSE, or staged onto a disk
PATH_SCHEME = ""  # a path under a mounted volume


@dataclass(frozen=True)
class ModelUri:
    scheme: str  # HF_SCHEME, GCS_SCHEME or PATH_SCHEME
    location: str  # the repository id, the bucket path or the path

    @classmethod
    def parse(cls, uri: str) -> ModelUri:
        scheme, sep, rest = uri.partition("://")
        return cls(scheme, rest) if sep else cls(PATH_SCHEME, uri)

    @classmethod
    def hf(cls, repo: str) -> ModelUri:
        return cls(HF_SCHEME, repo)

    @property
    def staged(self) -> bool:
        """Copied whole to local files before it is loaded (not read where it lies)."""
        return self.scheme in (HF_SCHEME, GCS_SCHEME)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.location}" if self.scheme else self.location
