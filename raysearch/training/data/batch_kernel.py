"""One fused GPU pass for a training batch of an in-memory image set.

The uint8 images of an :class:`~raysearch.training.data.images.ImageTensorDataset` batch are
gathered by index, zero-padded, randomly cropped, flipped and normalised per channel
(:class:`~raysearch.training.data.images.CropFlip`, then ``(x / 255 - mean) / std``). In
plain torch that is a dozen small kernels per training step (the index gather, the pad, the
index grids of the crop and flip, the gather, the float conversion and three in-place passes
of the normalisation): on a launch-bound loop such as a ResNet-18 on CIFAR-sized images they
cost the GPU time of several layers.

:func:`fused_batch` does it all in one Triton kernel: a program takes one channel of one
sample and a block of output pixels, reads each pixel's source ``images[index[b], c, dy + i -
padding, dx + j' - padding]`` (``j' = W - 1 - j`` when flipped; zero outside the image) and
writes its normalised float32 value. The divisions are rounded to nearest as torch's are, so
the batch equals the plain-torch path's to the bit.

Triton comes with PyTorch's CUDA wheels for Linux; where it is missing, or the images are not on
a CUDA device, :func:`kernel_ready` is False and the dataset takes its plain-torch path. Where
the kernel fails to compile or launch, :func:`disable` logs one warning and the process goes on
in plain torch. The tests run the kernel on the CPU through Triton's interpreter
(``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["KERNEL_DEVICES", "disable", "fused_batch", "kernel_ready"]

#: Device types on which the dataset takes the fused path (the tests add "cpu" under Triton's
#: interpreter).
KERNEL_DEVICES = {"cuda"}
#: Output pixels of one program.
_BLOCK = 1024


@functools.cache
def _kernel() -> Any:
    """The Triton kernel (compiled on first launch), or None where Triton does not import."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def crop_flip_normalise(
        images_ptr, index_ptr, draws_ptr, mean_ptr, std_ptr, out_ptr,
        N, B, C, H, W, stride_n, stride_c, stride_h, stride_w, padding,
        AUGMENT: tl.constexpr, BLOCK: tl.constexpr,
    ):
        # channel c of sample b, output pixels pix; draws: (3, B) dy, dx, flip
        bc = tl.program_id(0)
        b = bc // C
        c = bc % C
        pix = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = pix < H * W
        i = pix // W
        j = pix % W
        source = tl.load(index_ptr + b).to(tl.int64)
        source = tl.where(source < 0, source + N, source)  # torch's negative indices
        inside = inside & (source >= 0) & (source < N)  # torch's gather of the labels raises
        if AUGMENT:
            dy = tl.load(draws_ptr + b)
            dx = tl.load(draws_ptr + B + b)
            flip = tl.load(draws_ptr + 2 * B + b)
            j = tl.where(flip != 0, W - 1 - j, j)
            i = i + dy - padding
            j = j + dx - padding
            inside = inside & (i >= 0) & (i < H) & (j >= 0) & (j < W)
        at = (source * stride_n + c.to(tl.int64) * stride_c + i.to(tl.int64) * stride_h
              + j.to(tl.int64) * stride_w)
        v = tl.load(images_ptr + at, mask=inside, other=0).to(tl.float32)
        v = tl.math.div_rn(v, 255.0)
        v = tl.math.div_rn(v - tl.load(mean_ptr + c), tl.load(std_ptr + c))
        tl.store(out_ptr + bc.to(tl.int64) * H * W + pix, v, mask=pix < H * W)

    return crop_flip_normalise


def disable(error: BaseException) -> None:
    """Take the plain-torch path from now on in this process, after the kernel raised `error`.

    Logs one warning naming the error; the dataset builds the batch in plain torch.
    """
    if KERNEL_DEVICES:
        logger.warning("the fused batch kernel failed (%s: %s); batches are built in plain "
                       "torch", type(error).__name__, " ".join(str(error).split())[:300])
    KERNEL_DEVICES.clear()


def kernel_ready(images: torch.Tensor) -> bool:
    """Whether :func:`fused_batch` runs for the uint8 (N, C, H, W) `images`."""
    return (images.device.type in KERNEL_DEVICES and images.dtype == torch.uint8
            and images.ndim == 4 and _kernel() is not None)


def fused_batch(images: torch.Tensor, index: torch.Tensor, draws: torch.Tensor | None,
                padding: int, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """The normalised, cropped and flipped batch ``images[index]`` in one kernel.

    Args:
        images: uint8 (N, C, H, W), any strides, on a device of :data:`KERNEL_DEVICES`.
        index: int64 (B,) sample indices in [-N, N), on the images' device (an index outside
            reads zeros: check it first, as the labels' gather does).
        draws: int64 (3, B) per sample: crop offsets ``dy`` and ``dx`` in ``{0, ...,
            2 * padding}`` and 1 to flip (0 not), on the images' device; None: no augmentation.
        padding: zero-padding per side in pixels (the crop window is H x W of the padded image).
        mean: float32 (C,) per-channel mean in [0, 1] pixel units, on the images' device.
        std: float32 (C,) per-channel standard deviation, on the images' device.

    Returns:
        float32 (B, C, H, W) contiguous: ``(crop_flip(images[index]) / 255 - mean) / std``.
    """
    n, c, h, w = images.shape
    b = index.numel()
    out = torch.empty((b, c, h, w), dtype=torch.float32, device=images.device)
    if b == 0:
        return out
    # Triton launches on the current CUDA device: make it the images' one
    on = torch.cuda.device(images.device) if images.is_cuda else contextlib.nullcontext()
    with on:
        _kernel()[(b * c, -(-(h * w) // _BLOCK))](
            images, index, index if draws is None else draws.contiguous(), mean, std, out,
            n, b, c, h, w, *images.stride(), padding, AUGMENT=draws is not None, BLOCK=_BLOCK,
        )
    return out
