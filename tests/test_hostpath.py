"""hostpath: where the lossy passes run, and the host memory their outputs take."""

from __future__ import annotations

import torch

from ckptzip import hostpath


def test_torch_ops_only_sends_host_tensors_down_the_device_path_and_restores() -> None:
    tensor = torch.zeros(4)
    assert hostpath.native(tensor) and hostpath.native_device(torch.device("cpu"))
    with hostpath.torch_ops_only():
        assert not hostpath.native(tensor)
        with hostpath.torch_ops_only():
            assert not hostpath.native_device(tensor.device)
        assert not hostpath.native(tensor)
    assert hostpath.native(tensor)
    assert not hostpath.native(tensor, torch.zeros(4, device="meta"))


def test_large_outputs_reuse_the_memory_of_freed_ones() -> None:
    """From PAGE_BUFFER_BYTES on, an output is a PageBuffer: freed, its mapping (already faulted
    in) serves the next output of the same size."""
    small = hostpath.empty((16,), torch.float32)
    assert small.shape == (16,) and small.dtype == torch.float32
    large = hostpath.empty((512, 1024), torch.float32)  # 2 MiB
    assert large.shape == (512, 1024) and large.dtype == torch.float32 and large.is_contiguous()
    large.fill_(1.5)
    address = large.data_ptr()
    assert address % (2 << 20) == 0  # on a 2 MiB boundary: huge pages
    del large
    again = hostpath.empty((1024, 512), torch.float32)
    assert again.data_ptr() == address
    codes = hostpath.empty((3, 1 << 20), torch.uint8)
    assert codes.shape == (3, 1 << 20) and codes.dtype == torch.uint8


def test_subtract_and_matmul_are_torchs_arithmetic_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(700, 800, generator=g)
    b = torch.randn(700, 800, generator=g)
    assert torch.equal(hostpath.subtract(a, b), a - b)
    u, v = torch.randn(700, 8, generator=g), torch.randn(800, 8, generator=g)
    assert torch.equal(hostpath.matmul(u, v.T), u @ v.T)
    # other dtypes, shapes or devices take torch's plain ops
    assert torch.equal(hostpath.subtract(a.double(), b), a.double() - b)
    with hostpath.torch_ops_only():
        assert torch.equal(hostpath.matmul(u, v.T), u @ v.T)
