"""The layout table of docs/development.md names every top-level folder of the repository, and only paths that exist."""

from __future__ import annotations

import re
import subprocess

from scripts.manifests import ROOT


def test_the_layout_table_matches_the_tree():
    text = (ROOT / "docs" / "development.md").read_text().split("## Layout", 1)[1]
    rows = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]
    paths = {p for row in rows for p in re.findall(r"`([^`]+)`", row)}
    assert paths and all((ROOT / p).exists() for p in paths), [p for p in paths if not (ROOT / p).exists()]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    folders = {f.split("/")[0] for f in tracked if "/" in f and not f.startswith(".")}
    listed = {p.split("/")[0] for p in paths}
    assert folders <= listed, f"folders the layout table does not name: {sorted(folders - listed)}"
