"""A CR's status in and out: read once from the API into its typed model, written back in one form.

The lifecycles decide on `api.GemmaFineTuneStatus` / `api.GemmaServeStatus`, the same models the
CRD schema is made from. What the operator writes is the model's JSON form with only the fields
that were ever set and are not None: a field the lifecycle clears is left out, as is one it never
set (an empty list it never wrote stays absent).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from gemma_operator import api

log = logging.getLogger("gemma_operator")

S = TypeVar("S", bound=api.StatusModel)


def read(status_type: type[S], raw: Mapping[str, Any] | None) -> S:
    """The status as the API returned it, typed. A value this version cannot read (another version
    of the operator wrote it) is left out, with a warning, rather than failing every reconcile: the
    lifecycle then decides as if it were not set. Fields it does not know are kept as they are."""
    data = copy.deepcopy(dict(raw or {}))
    while True:
        try:
            return status_type.model_validate(data)
        except ValidationError as e:
            error = e.errors()[0]
            # A missing required field: the object lacking it goes; an item of a list goes whole.
            path = _up_to_item(error["loc"][:-1] if error["type"] == "missing" else error["loc"])
            if not path or not _drop(data, path):
                raise
            log.warning("status.%s left out: %s", ".".join(map(str, path)), error["msg"])


def written(model: api.StatusModel) -> dict[str, Any]:
    """The JSON form the operator writes: the fields set, by their wire names, None left out."""
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude_none=True)


def _up_to_item(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    for i, part in enumerate(loc):
        if isinstance(part, int):
            return loc[: i + 1]
    return loc


def _drop(data: Any, path: tuple[int | str, ...]) -> bool:
    """Remove what `path` leads to; False when it leads nowhere."""
    *parents, last = path
    for part in parents:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return False
    try:
        del data[last]
    except (KeyError, IndexError, TypeError):
        return False
    return True
