"""The scheduler's rules the tests check pods against."""

from __future__ import annotations


def tolerates(pod_spec: dict, taint: dict) -> bool:
    """Whether a pod tolerates a taint (kubernetes core/v1 Toleration.ToleratesTaint)."""
    for t in pod_spec.get("tolerations") or []:
        if t.get("effect") not in (None, "", taint["effect"]) or t.get("key") not in (None, "", taint["key"]):
            continue
        if t.get("operator") == "Exists" or t.get("value") == taint["value"]:
            return True
    return False
