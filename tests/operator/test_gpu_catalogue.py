"""The GPU facts the operator schedules with (sources: docs/reference gke-gpu.md)."""

from typing import get_args

import pytest

from gemma_operator import api, gpu


def test_the_api_offers_exactly_the_catalogue_s_types_and_counts():
    assert set(get_args(api.GpuType)) == set(gpu.TYPES)
    assert get_args(api.GpuCount) == gpu.COUNTS


@pytest.mark.parametrize(
    "gpu_type,count,machine,machine_gpus",
    [
        # Compute Engine's A3 High machine types: 1, 2, 4 and 8 H100s.
        ("nvidia-h100-80gb", 1, "a3-highgpu-1g", 1),
        ("nvidia-h100-80gb", 2, "a3-highgpu-2g", 2),
        ("nvidia-h100-80gb", 4, "a3-highgpu-4g", 4),
        ("nvidia-h100-80gb", 8, "a3-highgpu-8g", 8),
        # A3 Mega and A3 Ultra come with 8 GPUs only: a pod of fewer shares the node.
        ("nvidia-h100-mega-80gb", 2, "a3-megagpu-8g", 8),
        ("nvidia-h200-141gb", 1, "a3-ultragpu-8g", 8),
        ("nvidia-h200-141gb", 8, "a3-ultragpu-8g", 8),
        ("nvidia-a100-80gb", 4, "a2-ultragpu-4g", 4),
        ("nvidia-l4", 1, "g2-standard-32", 1),
        ("nvidia-l4", 8, "g2-standard-96", 8),
    ],
)
def test_machine_type_per_count(gpu_type, count, machine, machine_gpus):
    s = gpu.shape(gpu_type, count)
    assert (s.machine.name, s.machine.gpus) == (machine, machine_gpus)
    assert s.host_share == count / machine_gpus


def test_every_count_of_every_type_has_a_machine():
    for t in gpu.TYPES.values():
        assert [m.gpus for m in t.machines] == sorted(m.gpus for m in t.machines)
        for count in gpu.COUNTS:
            assert t.machine(count).gpus >= count


def test_hbm_and_peak_per_type():
    h100, h200 = gpu.TYPES["nvidia-h100-80gb"], gpu.TYPES["nvidia-h200-141gb"]
    assert (h100.hbm_gib_per_chip, h100.peak_bf16_tflops) == (80.0, 989.0)
    assert (h200.hbm_gib_per_chip, h200.peak_bf16_tflops) == (141.0, 989.0)
    # vLLM's API-server default for --max-num-batched-tokens (vllm/engine/arg_utils.py get_batch_defaults):
    # 8192 on GPUs of 70 GiB or more that are not A100s, 2048 below.
    assert h100.vllm_max_num_batched_tokens == h200.vllm_max_num_batched_tokens == 8192
    assert (
        gpu.TYPES["nvidia-a100-80gb"].vllm_max_num_batched_tokens
        == gpu.TYPES["nvidia-l4"].vllm_max_num_batched_tokens
        == 2048
    )


def test_node_selector_and_toleration():
    s = gpu.shape("nvidia-h100-80gb", 2)
    assert gpu.node_selector(s) == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    sel = gpu.node_selector(s, spot=True, node_pool="h100")
    assert sel == {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
        "cloud.google.com/gke-spot": "true",
        "cloud.google.com/gke-nodepool": "h100",
    }
    assert gpu.GPU_TOLERATION == {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_an_unknown_type_lists_the_known_ones():
    with pytest.raises(KeyError, match=r"no GPU type 'nvidia-b200'; allowed: nvidia-h100-80gb, "):
        gpu.shape("nvidia-b200", 8)
