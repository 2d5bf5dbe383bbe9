"""The one image decoder: every mode Pillow reads becomes faithful 8-bit RGB, upright by its EXIF
orientation; what has no faithful reading is refused. References are numpy arithmetic on the
pixels written, never the decoder itself."""

from __future__ import annotations

import io
import os
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from vlm_decade.imaging.decode import ImageDecodeError, load_rgb

ORIENTATION = 0x0112


def over(rgb: np.ndarray, alpha: np.ndarray, background) -> np.ndarray:
    """The composite a person sees, in floating point: c * a/255 + b * (1 - a/255), rounded."""
    a = alpha.astype(np.float64)[:, :, None] / 255.0
    return np.rint(rgb.astype(np.float64) * a + np.asarray(background, np.float64) * (1.0 - a)).astype(np.uint8)


def png(array: np.ndarray, bits: int = 16) -> bytes:
    """A PNG written by hand (Pillow cannot write 16-bit RGB): gray (H, W) or RGB (H, W, 3)."""
    height, width = array.shape[:2]
    colour = 2 if array.ndim == 3 else 0
    dtype = ">u2" if bits == 16 else "u1"
    raw = b"".join(b"\x00" + np.ascontiguousarray(array[y]).astype(dtype).tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, bits, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def bomb_png() -> bytes:
    """A PNG whose header claims 20,000 x 20,000 pixels (400 megapixels) over a few bytes of data."""
    head = png(np.zeros((1, 1), np.uint8), bits=8)
    header = struct.pack(">IIBBBBB", 20_000, 20_000, 8, 0, 0, 0, 0)
    ihdr = struct.pack(">I", 13) + b"IHDR" + header + struct.pack(">I", zlib.crc32(b"IHDR" + header) & 0xFFFFFFFF)
    return head[:8] + ihdr + head[8 + 25 :]


def saved(tmp_path: Path, image: Image.Image, name: str, **options) -> Path:
    path = tmp_path / name
    image.save(path, **options)
    return path


def gray(values: np.ndarray) -> np.ndarray:
    return np.repeat(values.astype(np.uint8)[:, :, None], 3, axis=2)


# --- wide pixel types are scaled, not clipped ---------------------------------------------------------


def test_a_16_bit_png_is_scaled_not_white(tmp_path):
    values = np.array([[0, 257, 32768], [1000, 60000, 65535]], dtype=np.uint16)
    path = tmp_path / "deep.png"
    path.write_bytes(png(values))
    rgb, mode = load_rgb(path)
    assert mode == "I;16"
    # 0 -> 0, 257 -> 1, 32768 -> 127.5 -> 128, 1000 -> 3.9 -> 4, 60000 -> 233.5 -> 233 (to even), 65535 -> 255
    assert rgb[:, :, 0].tolist() == [[0, 1, 128], [4, 233, 255]]
    assert (rgb[:, :, 0] == rgb[:, :, 1]).all() and (rgb[:, :, 1] == rgb[:, :, 2]).all()


def test_a_16_bit_rgb_png_keeps_its_colours(tmp_path):
    values = np.array([[[65535, 0, 32768], [1000, 20000, 50000]]], dtype=np.uint16)
    path = tmp_path / "deep-rgb.png"
    path.write_bytes(png(values))
    rgb, _ = load_rgb(path)
    assert np.abs(rgb.astype(float) - values / 257.0).max() <= 1.0  # Pillow keeps the high byte


def test_a_16_bit_pgm_opens_as_mode_i_and_is_scaled(tmp_path):
    values = np.array([[0, 1000], [40000, 65535]], dtype=">u2")
    path = tmp_path / "deep.pgm"
    path.write_bytes(b"P5\n2 2\n65535\n" + values.tobytes())
    rgb, mode = load_rgb(path)
    assert mode == "I"
    assert rgb[:, :, 0].tolist() == [[0, 4], [156, 255]]


def test_int32_pixels_beyond_16_bits_are_refused(tmp_path):
    path = saved(tmp_path, Image.fromarray(np.array([[0, 70000]], dtype=np.int32)), "wide.tif")
    with pytest.raises(ImageDecodeError, match="outside 0..65535"):
        load_rgb(path)


def test_a_float_tiff_in_0_1_is_scaled_not_black(tmp_path):
    values = np.array([[0.0, 0.25, 0.5], [0.75, 0.999, 1.0]], dtype=np.float32)
    rgb, mode = load_rgb(saved(tmp_path, Image.fromarray(values), "float.tif"))
    assert mode == "F"
    assert rgb[:, :, 0].tolist() == [[0, 64, 128], [191, 255, 255]]


def test_a_float_tiff_in_0_255_is_taken_as_is(tmp_path):
    values = np.array([[0.0, 2.4, 128.5], [200.0, 254.6, 255.0]], dtype=np.float32)
    rgb, _ = load_rgb(saved(tmp_path, Image.fromarray(values), "float255.tif"))
    assert rgb[:, :, 0].tolist() == [[0, 2, 128], [200, 255, 255]]


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ([[-0.5, 0.5]], "from -0.5 to 0.5"),
        ([[0.0, 300.0]], "from 0 to 300"),
        ([[0.0, np.nan]], "NaN"),
        ([[np.inf, 0.0]], "infinity"),
    ],
)
def test_float_pixels_without_a_known_scale_are_refused(tmp_path, values, says):
    path = saved(tmp_path, Image.fromarray(np.array(values, dtype=np.float32)), "bad.tif")
    with pytest.raises(ImageDecodeError, match=says) as info:
        load_rgb(path)
    assert str(path) in str(info.value)


@settings(max_examples=40, deadline=None)
@given(arrays(np.uint16, st.tuples(st.integers(1, 9), st.integers(1, 9))))
def test_any_16_bit_gray_png_is_round_v_over_257(values):
    rgb, _ = _load_bytes(png(values), ".png")
    assert (rgb == gray(np.rint(values / 257.0))).all()


@settings(max_examples=40, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 9), st.integers(1, 9)), elements=st.floats(0.0, 1.0, width=32)))
def test_any_float_image_in_0_1_is_round_255_v(values):
    rgb, _ = _load_bytes(_encoded(Image.fromarray(values), "TIFF"), ".tif")
    assert (rgb == gray(np.rint(values.astype(np.float64) * 255.0))).all()


def _encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **options)
    return buf.getvalue()


def _load_bytes(data: bytes, suffix: str):
    """load_rgb of bytes written to a file (hypothesis runs many examples in one test)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"image{suffix}"
        path.write_bytes(data)
        return load_rgb(path)


# --- 8-bit modes: exactly what Pillow's conversion gives (the demo's photos are unchanged); with an
# alpha channel, that composited onto white by hand ------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(["RGB", "L", "RGBA", "LA", "P", "1", "CMYK"]),
    arrays(np.uint8, st.tuples(st.integers(1, 8), st.integers(1, 8), st.just(4))),
)
def test_eight_bit_modes_match_pillows_conversion(mode, pixels):
    image = Image.fromarray(pixels, "RGBA").convert(mode)
    fmt, suffix = ("TIFF", ".tif") if mode == "CMYK" else ("PNG", ".png")
    rgb, read_mode = _load_bytes(_encoded(image, fmt), suffix)
    with Image.open(io.BytesIO(_encoded(image, fmt))) as reread:
        assert read_mode == reread.mode
        expected = np.asarray(reread.convert("RGB"))
        if reread.has_transparency_data:
            expected = over(expected, np.asarray(reread.convert("RGBA").getchannel("A")), (255, 255, 255))
    assert rgb.dtype == np.uint8 and rgb.shape == (*pixels.shape[:2], 3)
    assert (rgb == expected).all()


# --- EXIF orientation ---------------------------------------------------------------------------------

# What the EXIF specification says each orientation means, as numpy index arithmetic on the stored
# array: the picture a viewer shows.
UPRIGHT = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),  # the camera was turned: rotate 90 degrees clockwise
    7: lambda a: a.transpose(1, 0, 2)[::-1, ::-1],
    8: lambda a: np.rot90(a, 1),
}


@pytest.mark.parametrize("orientation", sorted(UPRIGHT))
def test_exif_orientation_is_applied(tmp_path, orientation):
    stored = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) * 12  # every pixel distinct
    image = Image.fromarray(stored)
    exif = image.getexif()
    exif[ORIENTATION] = orientation
    rgb, _ = load_rgb(saved(tmp_path, image, "photo.png", exif=exif.tobytes()))
    assert (rgb == UPRIGHT[orientation](stored)).all()


def test_a_portrait_photo_is_upright_in_the_images_table(tmp_path):
    from vlm_decade.core.errors import Problems
    from vlm_decade.core.tables import read_table
    from vlm_decade.stages.images import check_images

    image = Image.fromarray(np.zeros((30, 40, 3), np.uint8))  # stored landscape, shot portrait
    exif = image.getexif()
    exif[ORIENTATION] = 6
    saved(tmp_path, image, "portrait.jpg", exif=exif.tobytes())
    saved(tmp_path, Image.fromarray(np.zeros((5, 5), np.uint16)), "deep.png")
    (tmp_path / "t.csv").write_text("image_id,dataset,file\np,d,portrait.jpg\nq,d,deep.png\n")
    problems = Problems()
    images = check_images(read_table(tmp_path / "t.csv", ("image_id", "dataset", "file"), problems), tmp_path, problems)
    assert not problems
    p, q = images.select(["width", "height", "mode"]).to_pylist()
    assert (p["width"], p["height"], p["mode"]) == (30, 40, "RGB")
    assert q["mode"] == "I;16"


# --- files that are no images -------------------------------------------------------------------------


def test_a_decompression_bomb_is_refused_before_decoding(tmp_path):
    path = tmp_path / "bomb.png"
    path.write_bytes(bomb_png())
    with pytest.raises(ImageDecodeError, match="decompression bomb"):
        load_rgb(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_opening_it(tmp_path):
    os.mkfifo(tmp_path / "pipe.png")
    with pytest.raises(ImageDecodeError, match="FIFO"):
        load_rgb(tmp_path / "pipe.png")  # opening it would block forever


@pytest.mark.parametrize(
    ("content", "says"),
    [(b"plain text, no picture", "not a format Pillow recognises"), (None, "folder"), ("missing", "not found")],
)
def test_other_files_are_refused_with_the_reason(tmp_path, content, says):
    path = tmp_path / "x.png"
    if content is None:
        path.mkdir()
    elif content != "missing":
        path.write_bytes(content)
    with pytest.raises(ImageDecodeError, match=says):
        load_rgb(path)


def test_a_truncated_image_is_refused(tmp_path):
    data = _encoded(Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)), "PNG")
    path = tmp_path / "cut.png"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageDecodeError, match="not a readable image"):
        load_rgb(path)


def test_models_and_masks_previews_see_the_decoders_pixels(tmp_path):
    from vlm_decade.imaging.masks import MaskConfig, write_previews
    from vlm_decade.stages.describe.plan import Job, load_stimuli

    stored = np.arange(4 * 6, dtype=np.uint16).reshape(4, 6) * 2000
    (tmp_path / "deep.png").write_bytes(png(stored))
    image = Image.fromarray(np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) * 12)
    exif = image.getexif()
    exif[ORIENTATION] = 8
    saved(tmp_path, image, "turned.png", exif=exif.tobytes())
    for name in ("deep.png", "turned.png"):
        expected, _ = load_rgb(tmp_path / name)
        (stimulus,) = load_stimuli([Job("m", "i", "full", "p", "prompt", str(tmp_path / name), None, "k")])
        assert (stimulus.image == expected).all()
        write_previews(tmp_path / name, tmp_path / f"out-{name}", MaskConfig())
        with Image.open(tmp_path / f"out-{name}" / "full.png") as preview:
            assert (np.asarray(preview) == expected).all()
