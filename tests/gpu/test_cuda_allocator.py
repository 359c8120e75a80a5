"""torch_renaissance behind torch.cuda: PyTorch's stats, cuDNN benchmark, record_stream, OOM, install.

Each test runs one case of ``_cases.py`` in a fresh process (see conftest.py)
and checks the numbers it reports against values computed here.
"""
from __future__ import annotations

import pytest

MiB = 1 << 20

pytestmark = pytest.mark.gpu


def test_smoke(run_case):
    """run_all.sh's first step, also as a test: it raises on any wrong value."""
    r = run_case("smoke")
    assert r["allocated"] == 512 + 3 * MiB + 64 * MiB
    assert r["vmm"].startswith(("on", "off"))


def test_stats_match_pytorch_and_accelerator(run_case):
    r = run_case("stats")
    # 3 x 64 MiB allocated, one freed: 2 live, 3 at the peak.
    assert r["cuda_allocated"] == 2 * 64 * MiB
    assert r["accelerator_allocated"] == 2 * 64 * MiB
    assert r["cuda_stats_allocated"] == 2 * 64 * MiB
    assert r["ours_allocated"] == 2 * 64 * MiB
    assert r["cuda_max_allocated"] == 3 * 64 * MiB
    assert r["accelerator_max_allocated"] == 3 * 64 * MiB
    # Resetting peaks sets them to the current value.
    assert r["cuda_max_after_reset"] == 2 * 64 * MiB
    assert r["accelerator_max_after_reset"] == 2 * 64 * MiB
    assert r["reserved"] >= 2 * 64 * MiB


def test_cudnn_benchmark_conv(run_case):
    r = run_case("cudnn")
    assert r["shape"] == [8, 64, 126, 126]
    assert r["finite"] is True


def test_record_stream_delays_reuse(run_case):
    r = run_case("record_stream")
    # The check ran while the side stream was still sleeping...
    assert r["side_busy_at_check"] is True
    # ...so the freed block was not handed out again.
    assert r["same_address_while_busy"] is False
    assert r["y_ok"] is True


def test_record_stream_protects_side_stream_copy(run_case):
    r = run_case("record_stream_copy")
    # The side-stream copy read the tensor's ones, not the main stream's NaN refill.
    assert r["host_all_ones"] is True
    assert r["host_nan_count"] == 0
    assert r["refill_nan"] is True


def test_oom_raises_torch_oom_and_recovers(run_case):
    r = run_case("oom")
    sizes = [2 * r["total"], 2 ** 62]
    assert [e["size"] for e in r["errors"]] == sizes
    for e, size in zip(r["errors"], sizes):
        assert e["type"] == "OutOfMemoryError", e
        assert e["is_oom"] is True
        assert "CUDA out of memory" in e["message"]
        assert str(size) in e["message"]  # names the size in bytes
    assert r["after"] == float(MiB)


def test_install_after_cuda_init_raises(run_case):
    r = run_case("install_late")
    assert r["raised"] == "RuntimeError"
    assert "install('cuda')" in r["message"]
    assert "before the first CUDA tensor" in r["message"]
    assert "import torch_renaissance.auto" in r["message"]
    assert r["tensor_ok"] is True
    assert r["installed"] is False


def test_install_first_moves_our_counters(run_case):
    r = run_case("install_first")
    assert r["allocations_after"] == r["allocations_before"] + 1
    assert r["ours_allocated"] == 3 * MiB
    assert r["cuda_allocated"] == 3 * MiB


def test_auto_import_installs_from_env(run_case):
    r = run_case("auto", env={"TORCH_RENAISSANCE": "1"})
    assert r["installed"] == ["cuda"]
    assert r["ours_allocated"] == MiB
    assert r["cuda_allocated"] == MiB


def test_one_arena_per_device_from_the_call(run_case):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    r = run_case("multi_gpu")
    last = r["devices"] - 1
    assert r["x_device"] == last and r["y_device"] == last
    assert r["last"] == 3 * MiB
    assert r["last_torch"] == 3 * MiB
    assert r["first_torch"] == 0
