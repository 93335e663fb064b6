"""hostpath: where the lossy passes run, and the host memory their outputs take."""

from __future__ import annotations

import torch

from ckptzip import hostpath
from ckptzip.codecs import (
    BaseRatio,
    Dither,
    ExactZeros,
    LossyResidual,
    SqrtScale,
    TensorToTensor,
    TransformContext,
    undo,
)


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


def _consuming_cases() -> list[tuple[str, TensorToTensor, torch.Tensor, TransformContext]]:
    """Each stage with an in-place decode: a stored-side float32 input (zeros of both signs
    among its values) and the context it decodes in."""
    g = torch.Generator().manual_seed(5)
    n = 300_001  # past PAGE_BUFFER_BYTES: outputs from PageBuffers, as a large tensor's
    values = torch.randn(n, generator=g) * 1e-3
    values[::7] = 0.0
    values[1::11] = -0.0
    positive = torch.rand(n, generator=g) + 1e-3
    base = torch.randn(n, generator=g)
    mask = torch.randint(0, 256, (-(-n // 8),), generator=g, dtype=torch.uint8)
    return [
        ("dither", Dither(12345, 3e-4), values, TransformContext("t")),
        ("sqrt-scale", SqrtScale(0, "float32"), values, TransformContext("t", siblings={0: positive})),
        ("base-ratio", BaseRatio("float32"), values, TransformContext("t", base=positive)),
        ("zeros", ExactZeros(0), values, TransformContext("t", siblings={0: mask})),
        ("lossy-residual", LossyResidual("float32"), values, TransformContext("t", base=base)),
    ]


def test_decoding_in_place_gives_the_same_bits_in_the_inputs_memory() -> None:
    """A stage given its input (``decoded(..., in_place=True)``) writes the result there, bit
    for bit what its decode writes into new memory."""
    for name, stage, values, context in _consuming_cases():
        expected = stage.decode(values.clone(), context)
        given = values.clone()
        address = given.data_ptr()
        found = stage.decoded(given, context, in_place=True)
        assert found.data_ptr() == address, name
        assert torch.equal(found.view(torch.int32), expected.view(torch.int32)), name


class _Passes(TensorToTensor):
    """A stage that decodes to its input or to the context's base as they are (as a stage may
    return a tensor it did not make)."""

    codec_id = "test-passes"

    def __init__(self, to_base: bool = False) -> None:
        self.to_base = to_base

    def get_config(self) -> dict[str, object]:
        return {}

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        return tensor

    def decode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        return context.base if self.to_base and context.base is not None else tensor


def test_undo_gives_up_only_what_its_stages_made() -> None:
    """``undo`` lets a stage write in place only into an earlier stage's own output: never into
    the stored array, the base or a sibling, even where a stage hands one of them on."""
    for name, stage, values, context in _consuming_cases():
        stored = values.clone()
        kept = {k: v.clone() for k, v in (context.siblings or {}).items()}
        base = None if context.base is None else context.base.clone()
        # the stored array straight into the stage, and handed on unchanged by another first
        for stages in ((stage,), (stage, _Passes())):
            undo(stages, stored, context)
            assert torch.equal(stored.view(torch.int32), values.view(torch.int32)), name
        for k, v in kept.items():
            assert torch.equal((context.siblings or {})[k], v), name
        if base is not None:  # the base handed on as a stage's output
            undo((stage, _Passes(to_base=True)), stored, context)
            assert torch.equal(context.base.view(torch.int32), base.view(torch.int32)), name
    # a chain: the first stage's output is given up to the next, and the result is the chain's
    g = torch.Generator().manual_seed(9)
    codes = torch.randn(200_000, generator=g)
    scale = torch.rand(200_000, generator=g) + 0.5
    context = TransformContext("t", base=torch.randn(200_000, generator=g), siblings={0: scale})
    chain = (LossyResidual("float32"), SqrtScale(0, "float32"), Dither(7, 1e-3))
    expected = codes
    for stage in reversed(chain):
        expected = stage.decode(expected, context)
    stored = codes.clone()
    found = undo(chain, stored, context)
    assert torch.equal(found.view(torch.int32), expected.view(torch.int32))
    assert torch.equal(stored, codes)
