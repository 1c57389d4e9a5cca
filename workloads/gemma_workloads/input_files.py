"""Input files read with a message that says where they are broken and what to do about it.

An error a user has to act on names the file, the place in it (line, column, field) and the fix;
a Python traceback or a parser's bare `line 1 column 1` does neither.
"""

from __future__ import annotations

import json
from typing import Any

from etils import epath

COPY_AGAIN = "copy it again from the model's source"


class InputError(ValueError):
    """A broken input (file, folder or setting): bad input, never worth a retry."""


def read_json(path: epath.Path | str, fix: str = COPY_AGAIN, error: type[ValueError] = InputError) -> Any:
    """A JSON file's content, or `error` naming the file, the line and column, and `fix`."""
    path = epath.Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path} not found: {fix}") from None
    except IsADirectoryError:
        raise error(f"{path} is a folder, not a JSON file") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise error(f"{path}:{line}: byte 0x{raw[e.start]:02x} is not UTF-8: the file is damaged; {fix}") from None
    except json.JSONDecodeError as e:
        where = "empty file" if not raw.strip() else f"line {e.lineno} column {e.colno}: {e.msg}"
        raise error(f"{path}: not valid JSON ({where}): the file is truncated or damaged; {fix}") from None
