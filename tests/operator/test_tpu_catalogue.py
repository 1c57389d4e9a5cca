"""The TPU facts the operator schedules with (sources: docs/reference gke-tpu.md)."""

import pytest

from gemma_operator import tpu


@pytest.mark.parametrize(
    "generation,topology,chips,hosts,per_host,machine,name",
    [
        ("v5p", "2x2x1", 4, 1, 4, "ct5p-hightpu-4t", "v5p-8"),
        ("v5p", "2x2x2", 8, 2, 4, "ct5p-hightpu-4t", "v5p-16"),
        ("v5p", "2x4x4", 32, 8, 4, "ct5p-hightpu-4t", "v5p-64"),
        ("v5p", "4x4x4", 64, 16, 4, "ct5p-hightpu-4t", "v5p-128"),
        ("v6e", "1x1", 1, 1, 1, "ct6e-standard-1t", "v6e-1"),
        ("v6e", "2x2", 4, 1, 4, "ct6e-standard-4t", "v6e-4"),
        ("v6e", "2x4", 8, 1, 8, "ct6e-standard-8t", "v6e-8"),
        ("v6e", "4x4", 16, 4, 4, "ct6e-standard-4t", "v6e-16"),
    ],
)
def test_slices(generation, topology, chips, hosts, per_host, machine, name):
    s = tpu.resolve(generation, topology)
    assert (s.chips, s.hosts, s.chips_per_host, s.machine_type, s.name) == (chips, hosts, per_host, machine, name)
    assert s.multi_host == (hosts > 1)


def test_defaults_and_cpu():
    assert tpu.resolve("v5p", None).topology == "2x2x1"
    assert tpu.resolve("v6e", None).topology == "2x4"
    assert tpu.resolve("cpu", None) is None


def test_unknown_topology_lists_the_allowed_ones():
    with pytest.raises(KeyError, match=r"v6e has no topology '2x2x1'; allowed: 1x1, 2x2, 2x4, 4x4"):
        tpu.resolve("v6e", "2x2x1")


def test_node_selectors():
    s = tpu.resolve("v5p", "2x2x1")
    assert tpu.node_selector(s) == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x1",
    }
    sel = tpu.node_selector(s, spot=True, reservation="res-a", node_pool="pool-1")
    assert sel["cloud.google.com/gke-spot"] == "true"
    assert sel["cloud.google.com/reservation-name"] == "res-a"
    assert sel["cloud.google.com/reservation-affinity"] == "specific"
    assert sel["cloud.google.com/gke-nodepool"] == "pool-1"
    assert tpu.TPU_TOLERATION == {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}


def test_hbm_and_peak_per_generation():
    assert (tpu.GENERATIONS["v5p"].hbm_gib_per_chip, tpu.GENERATIONS["v5p"].peak_bf16_tflops) == (95.0, 459.0)
    assert (tpu.GENERATIONS["v6e"].hbm_gib_per_chip, tpu.GENERATIONS["v6e"].peak_bf16_tflops) == (32.0, 918.0)
