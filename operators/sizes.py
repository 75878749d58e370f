"""The sizes real layers have: for each kind of size, a ladder of the values real models use.

Plain data, imported by the composer's layouts (operators/layouts.py) and by the sandbox's
re-sizing (filters/checks/measure/resize.py), which may import it as it imports the floor
(operators/records.py): it imports nothing.

Every rung is a multiple of 8 (vector loads and tensor-core tiles want them), most a power
of two, the rest the usual in-between sizes. Sources: transformer hidden sizes (BERT 768,
GPT-2 1024 and 1600 (here 1536), Llama 4096, 5120, 8192), CNN widths (ResNet 64..2048,
MobileNet and EfficientNet 16..1280 by 16s and 32s), sequence lengths 64..16384, ImageNet
pixels (224, 112, 56) and powers of two, video clips of 8..64 frames.
"""
from __future__ import annotations

BATCH, HIDDEN, CHANNELS, SEQUENCE, SPATIAL, FRAMES = "batch", "hidden", "channels", "sequence", "spatial", "frames"
LADDERS: dict[str, tuple[int, ...]] = {
    BATCH: tuple(1 << k for k in range(3, 19)),  # 8 .. 262,144 (a memory-bound chain needs ~10^8 elements for 1 ms on an H200)
    HIDDEN: (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 8192, 12288, 16384),
    CHANNELS: (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048),
    SEQUENCE: (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
    SPATIAL: (8, 16, 32, 56, 64, 112, 128, 224, 256, 512, 1024),
    FRAMES: (8, 16, 32, 64),
}


def power_of_two(size: int) -> bool:
    return size > 0 and size & (size - 1) == 0


def in_ladders(size: int) -> bool:
    """Whether `size` is a rung of any ladder: a size some real layer has."""
    return any(size in ladder for ladder in LADDERS.values())
