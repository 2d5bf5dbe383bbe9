"""Images with transparency are seen as a person sees them: composited onto the study's background
before any model, mask or metric sees them. The files hold colours under their transparent pixels
unlike any background, so dropping the alpha (what decoding did before) cannot pass; references are
the composite computed by hand in numpy."""

from __future__ import annotations

import io
import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from tests.unit.test_decode import over
from vlm_decade.cli import app
from vlm_decade.core.errors import Problems
from vlm_decade.core.tables import read_table
from vlm_decade.imaging.decode import ImageDecodeError, background_text, load_image, load_rgb
from vlm_decade.imaging.masks import MaskConfig, apply_mask, mask_specs, occlusion
from vlm_decade.stages.describe.plan import Job, load_png, load_stimuli
from vlm_decade.stages.images import IMAGE_COLUMNS, check_images, images_table

ROOT = Path(__file__).resolve().parents[2]
# A cut-out: opaque blue in the middle, fully transparent edges over bright red leftovers, and a
# half-transparent ring over green.
RGB = np.zeros((12, 16, 3), np.uint8)
RGB[...] = (250, 10, 10)
RGB[3:9, 4:12] = (0, 200, 60)
RGB[4:8, 6:10] = (20, 40, 230)
ALPHA = np.zeros((12, 16), np.uint8)
ALPHA[3:9, 4:12] = 128
ALPHA[4:8, 6:10] = 255
ALPHA[0, 0] = 1  # almost transparent: rounding is checked too


def rgba_png(tmp_path: Path, name: str = "cutout.png") -> Path:
    path = tmp_path / name
    Image.fromarray(np.dstack([RGB, ALPHA]), "RGBA").save(path)
    return path


@pytest.mark.parametrize("background", ["white", "black", "#336699", "Gray"])
def test_an_rgba_png_is_composited_onto_the_background(tmp_path, background):
    colour = Image.new("RGB", (1, 1), background).getpixel((0, 0))
    decoded = load_image(rgba_png(tmp_path), background_text(background))
    assert decoded.transparent and decoded.mode == "RGBA"
    assert (decoded.rgb == over(RGB, ALPHA, colour)).all()
    assert (decoded.rgb[0, 1] == colour).all() and (decoded.rgb[5, 7] == (20, 40, 230)).all()  # gone, and kept


def test_la_and_palette_transparency_are_composited_too(tmp_path):
    gray = RGB[:, :, 0]
    Image.fromarray(np.dstack([gray, ALPHA]), "LA").save(tmp_path / "la.png")
    (rgb, mode) = load_rgb(tmp_path / "la.png", "#000000")
    assert mode == "LA" and (rgb == over(np.dstack([gray] * 3), ALPHA, (0, 0, 0))).all()
    # A palette whose entry 0 (red, the leftovers) is transparent: a GIF's or an 8-bit PNG's cut-out.
    indices = np.where(ALPHA == 0, 0, 1).astype(np.uint8)
    palette = Image.fromarray(indices, "P")
    palette.putpalette([250, 10, 10, 20, 40, 230] + [0] * 762)
    for name in ("p.png", "p.gif"):
        palette.save(tmp_path / name, transparency=0)
        rgb, mode = load_rgb(tmp_path / name)
        expected = np.where((indices == 0)[:, :, None], 255, np.array([20, 40, 230], np.uint8)).astype(np.uint8)
        assert mode == "P" and (rgb == expected).all(), name
    # An RGB PNG whose transparent colour is red (tRNS), and an opaque RGBA file: nothing composited.
    Image.fromarray(RGB).save(tmp_path / "trns.png", transparency=(250, 10, 10))
    assert (
        load_rgb(tmp_path / "trns.png")[0] == np.where((RGB == (250, 10, 10)).all(axis=2)[:, :, None], 255, RGB)
    ).all()
    Image.fromarray(np.dstack([RGB, np.full_like(ALPHA, 255)]), "RGBA").save(tmp_path / "opaque.png")
    opaque = load_image(tmp_path / "opaque.png")
    assert not opaque.transparent and (opaque.rgb == RGB).all()


def test_a_palette_with_partial_transparency_is_composited_without_a_warning(tmp_path):
    # An 8-bit PNG whose palette has an alpha per entry (tRNS as bytes), as many cut-outs are saved:
    # Pillow warns when such an image is converted straight to RGB, on every image of a study.
    indices = np.where(ALPHA == 0, 0, np.where(ALPHA == 255, 2, 1)).astype(np.uint8)
    palette = Image.fromarray(indices, "P")
    palette.putpalette([250, 10, 10, 0, 200, 60, 20, 40, 230] + [0] * 759)
    palette.save(tmp_path / "pa.png", transparency=bytes([0, 128, 255]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rgb, mode = load_rgb(tmp_path / "pa.png", "#000000")
    colours = np.array([[250, 10, 10], [0, 200, 60], [20, 40, 230]], np.uint8)[indices]
    alpha = np.array([0, 128, 255], np.uint8)[indices]
    assert mode == "P" and (rgb == over(colours, alpha, (0, 0, 0))).all()


def test_background_none_refuses_an_image_with_transparency(tmp_path):
    with pytest.raises(ImageDecodeError, match="has transparent pixels, and data.background is none"):
        load_rgb(rgba_png(tmp_path), background_text("none"))
    Image.fromarray(RGB).save(tmp_path / "plain.png")
    assert (load_rgb(tmp_path / "plain.png", "none")[0] == RGB).all()
    with pytest.raises(ValueError, match="'transparent-ish' is no colour"):
        background_text("transparent-ish")
    assert background_text(" White ") == background_text("#FFFFFF") == "#ffffff"


def test_the_pixels_backends_receive_are_the_composite_for_full_and_masked_variants(tmp_path):
    path = str(rgba_png(tmp_path))
    expected = over(RGB, ALPHA, (255, 255, 255))
    spec = mask_specs(MaskConfig())[0]
    jobs = [
        Job("m", "i", "full", "p", "say", path, None, "k1"),
        Job("m", "i", spec.mask_id, "p", "say", path, spec, "k2"),
    ]
    full, masked = load_stimuli(jobs)
    assert (full.image == expected).all()
    keep = 1.0 - occlusion(*expected.shape[:2], spec)[:, :, None]
    assert (masked.image == np.rint(expected * keep).astype(np.uint8)).all()
    assert (masked.image == apply_mask(expected, spec)).all()
    # What an API model is sent: the PNG of the same pixels.
    sent = [np.asarray(Image.open(io.BytesIO(data))) for data in load_png(jobs)]
    assert (sent[0] == expected).all() and (sent[1] == masked.image).all()
    # An RGBA array handed to a backend directly is composited alike.
    from vlm_decade.imaging.masks import as_rgb

    assert (as_rgb(np.dstack([RGB, ALPHA])) == expected).all()


def test_the_image_check_records_transparency_and_refuses_it_under_none(tmp_path):
    rgba_png(tmp_path)
    Image.fromarray(RGB).save(tmp_path / "plain.png")
    (tmp_path / "images.csv").write_text("image_id,dataset,file\na,d,cutout.png\nb,d,plain.png\n")
    table = read_table(tmp_path / "images.csv", IMAGE_COLUMNS, Problems())
    problems = Problems()
    images = check_images(table, tmp_path, problems, background="#000000")
    assert not problems and images.column("transparent").to_pylist() == [True, False]
    assert images_table(images, "#000000").column("background").to_pylist() == ["#000000", None]
    problems = Problems()
    check_images(table, tmp_path, problems, background="none")
    (problem,) = problems.items
    assert (str(problem.file), problem.row, problem.field) == (str(tmp_path / "images.csv"), 2, "file")
    assert "cutout.png has transparent pixels, and data.background is none" in problem.message


def example(tmp_path: Path, background: str | None) -> Path:
    """The documented Study A example with one of its images made a transparent cut-out."""
    folder = shutil.copytree(ROOT / "docs" / "examples" / "study_a", tmp_path / "study_a")
    pixels = np.asarray(Image.open(folder / "images" / "coco_1.png").convert("RGB"))
    alpha = np.full(pixels.shape[:2], 255, np.uint8)
    alpha[: pixels.shape[0] // 3] = 0
    Image.fromarray(np.dstack([pixels, alpha]), "RGBA").save(folder / "images" / "coco_1.png")
    study = yaml.safe_load((folder / "study.yaml").read_text())
    if background is not None:
        study["data"]["background"] = background
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    return folder / "study.yaml"


@pytest.mark.parametrize("background, said", [(None, "#ffffff"), ("black", "#000000")])
def test_validate_says_how_many_images_have_transparency_and_the_background(tmp_path, background, said):
    done = CliRunner().invoke(app, ["validate", str(example(tmp_path, background))])
    text = " ".join(done.output.split())
    assert done.exit_code == 0, text
    assert f"1 of 3 images have transparent pixels, composited onto {said} (data.background)" in text


def test_validate_refuses_transparency_under_background_none_naming_file_and_row(tmp_path):
    study = example(tmp_path, "none")
    done = CliRunner().invoke(app, ["validate", str(study)])
    text = "".join(done.output.split())  # the terminal may wrap the long path anywhere
    assert done.exit_code == 2
    assert f"{study.parent / 'images.csv'},row2,field'file':" in text and "data.backgroundisnone" in text


def test_the_studys_background_reaches_the_models_and_their_cache_keys(tmp_path):
    """The images table's background travels with each job: the stimulus is composited onto it, and
    a transparent image's cache key names it (a new background redoes its rows), while an opaque
    image's key stays what it was before transparency was recorded."""
    from vlm_decade.stages.describe.plan import Plan, jobs_from, plan_jobs
    from vlm_decade.studies import load_study

    rgba_png(tmp_path)
    Image.fromarray(RGB).save(tmp_path / "plain.png")
    path = str(tmp_path / "cutout.png")
    (black,) = load_stimuli([Job("m", "i", "full", "p", "say", path, None, "k", (), "#000000")])
    assert (black.image == over(RGB, ALPHA, (0, 0, 0))).all()

    study = load_study(example(tmp_path, None))
    plan = Plan(prompts={m.name: [("p", "say")] for m in study.models})

    def keys(backgrounds):
        images = pa.table(
            {
                "image_id": ["a", "b"],
                "dataset": ["d", "d"],
                "path": [path, str(tmp_path / "plain.png")],
                "sha256": ["s1", "s2"],
                "background": pa.array(backgrounds, pa.string()),
            }
        )
        table = plan_jobs(study, plan, images)
        return table.column("cache_key").to_pylist(), jobs_from(table, plan, images)

    (white_key, plain_key), jobs = keys(["#ffffff", None])
    (black_key, plain_again), _ = keys(["#000000", None])
    (old_key, plain_old), _ = keys([None, None])  # an images table of before: both opaque
    assert white_key != black_key and plain_key == plain_again == plain_old and old_key != white_key
    assert [j.background for j in jobs] == ["#ffffff", None]
