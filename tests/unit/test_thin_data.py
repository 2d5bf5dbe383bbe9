"""Human data too thin for what Study A asks is said, not hidden: `validate` warns (and fails with
--strict) when the descriptions are too few for a gold standard by votes or consensus, for the top-
and bottom-ranked groups, or for spatial dependence, naming the file, the counts and what the report
will lack; the minimums are those of the ranking and spatial code. Hand-built tables throughout."""

from __future__ import annotations

import copy

import pyarrow as pa
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from vlm_decade.cli import app
from vlm_decade.studies import study_from_dict
from vlm_decade.studies.decade.data import (
    GOLD_NOTE,
    GROUPS_NOTE,
    MASKED_NOTE,
    MIN_FOR_CONSENSUS,
    MIN_FOR_GROUPS,
    REFERENCES_SCHEMA,
    thin_human_data,
)
from vlm_decade.studies.decade.ranking import consensus_scores, group_sizes

STUDY = {
    "name": "thin",
    "data": {"images": "images.csv", "image_dir": "imgs", "descriptions": "humans.csv"},
    "models": [
        {"name": "old", "backend": "imported", "model_id": "x", "era": "pre-mllm", "options": {"file": "c.csv"}}
    ],
}


def study(**changes):
    raw = copy.deepcopy(STUDY)
    for key, value in changes.items():
        raw[key] = value
    return study_from_dict(raw)


def masked_study(masks: dict | None = None):
    raw = copy.deepcopy(STUDY)
    raw["models"][0]["variants"] = "all"
    raw["taxonomy"] = {}
    if masks is not None:
        raw["masks"] = masks
    return study_from_dict(raw)


def references(full: dict[str, int], masked: dict[tuple[str, str], int] = (), dataset_of=None) -> pa.Table:
    """`full[image]` full descriptions and `masked[(image, mask)]` masked ones of each image."""
    rows = []

    def add(image_id, condition, n):
        dataset = (dataset_of or {}).get(image_id, "ds")
        for k in range(n):
            rows.append(
                {
                    "description_id": f"{image_id}-{condition}-{k}",
                    "image_id": image_id,
                    "dataset": dataset,
                    "condition": condition,
                    "worker_id": f"w{k}",
                    "role": "other" if condition == "full" else "masked",
                    "votes": 0,
                    "shown": 0,
                    "text": f"text {k}",
                }
            )

    for image_id, n in full.items():
        add(image_id, "full", n)
    for (image_id, mask), n in dict(masked).items():
        add(image_id, mask, n)
    return pa.Table.from_pylist(rows, schema=REFERENCES_SCHEMA)


def said(thin, topic):
    return [t.message for t in thin if t.topic == topic]


def test_the_minimums_are_those_of_the_ranking_code():
    assert MIN_FOR_GROUPS == 3 and group_sizes(2, 4, 4) == (0, 0) and group_sizes(3, 4, 4) == (1, 1)
    # Two descriptions are exactly as similar to each other: consensus cannot choose between them.
    two = consensus_scores(["a red bus on a street", "a bus"])
    three = consensus_scores(["a red bus on a street", "a bus", "a red bus"])
    assert MIN_FOR_CONSENSUS == 3 and two[0] == two[1] and len(set(three.round(12))) == 3


def test_one_description_per_image_under_consensus_says_no_gold_choice_and_no_human_bands():
    thin = thin_human_data(study(), references({"a": 1, "b": 1, "c": 1}), {"ds": "consensus"})
    assert [(t.topic, t.dataset) for t in thin] == [(GOLD_NOTE, "ds"), (GROUPS_NOTE, "ds")]
    gold, groups = thin[0].message, thin[1].message
    assert gold.startswith("humans.csv: 3 of 3 images of dataset 'ds' have 1 description; the consensus rule")
    assert "needs at least 3 to choose" in gold and "chosen by no one" in gold
    assert groups == (
        "humans.csv: 3 of 3 images of dataset 'ds' have 1 description; the top- and bottom-ranked human groups "
        "need at least 3 (the gold standard and one for each): the report has no top- or bottom-ranked human "
        "bands for 'ds' and no comparison with them"
    )


def test_mixed_counts_are_broken_down_and_a_partial_shortage_names_the_images_left():
    thin = thin_human_data(study(), references({"a": 1, "b": 2, "c": 2, "d": 9}), {"ds": "consensus"})
    (gold,) = said(thin, GOLD_NOTE)
    assert gold.startswith(
        "humans.csv: 3 of 4 images of dataset 'ds' have fewer than 3 descriptions (1 has 1, 2 have 2)"
    )
    (groups,) = said(thin, GROUPS_NOTE)
    assert "the human bands and comparisons of 'ds' rest on the other 1 images" in groups


def test_votes_need_two_descriptions_and_consensus_is_not_claimed():
    thin = thin_human_data(study(), references({"a": 1, "b": 9}), {"ds": "votes"})
    (gold,) = said(thin, GOLD_NOTE)
    assert gold.startswith(
        "humans.csv: 1 of 2 images of dataset 'ds' has 1 description; votes choose between at least 2"
    )
    assert "consensus" not in gold
    # Two descriptions are enough for votes, not for consensus.
    assert said(thin_human_data(study(), references({"a": 2}), {"ds": "votes"}), GOLD_NOTE) == []
    assert said(thin_human_data(study(), references({"a": 2}), {"ds": "consensus"}), GOLD_NOTE) != []


def test_groups_smaller_than_asked_are_said_and_fit_when_the_study_asks_less():
    refs = references({"a": 5, "b": 9})
    (groups,) = said(thin_human_data(study(), refs, {"ds": "votes"}), GROUPS_NOTE)
    assert groups.startswith("humans.csv: 1 of 2 images of dataset 'ds' has 5 descriptions; groups of ranking.top_k 4")
    assert "need 9 (with the gold standard)" in groups
    assert thin_human_data(study(ranking={"top_k": 2, "bottom_k": 2}), refs, {"ds": "votes"}) == []


def test_each_dataset_is_judged_on_its_own_images():
    refs = references({"a": 1, "b": 9}, dataset_of={"a": "small", "b": "big"})
    thin = thin_human_data(study(), refs, {"small": "consensus", "big": "consensus"})
    assert {t.dataset for t in thin} == {"small"}
    assert all("of dataset 'small'" in t.message for t in thin)


def test_masked_variants_without_masked_human_descriptions_leave_the_spatial_panel_empty():
    refs = references({"a": 9, "b": 9})
    (masked,) = said(thin_human_data(masked_study(), refs, {"ds": "votes"}), MASKED_NOTE)
    assert masked.startswith(
        "humans.csv has no masked descriptions (condition m1, m2, m3) and old describes the masked variants "
        "(variants: all);"
    )
    assert masked.endswith("the report has no spatial dependence labels and no heat maps")
    # No taxonomy, or no model that describes the masked variants: no spatial panel to be empty.
    assert said(thin_human_data(study(), refs, {"ds": "votes"}), MASKED_NOTE) == []
    assert said(thin_human_data(study(taxonomy={}), refs, {"ds": "votes"}), MASKED_NOTE) == []


def test_too_few_masked_descriptions_per_mask_or_too_few_masks_are_said():
    enough = {(i, m): 2 for i in ("a", "b") for m in ("m1", "m2", "m3")}
    assert thin_human_data(masked_study(), references({"a": 9, "b": 9}, enough), {"ds": "votes"}) == []
    one_short = {**enough, ("b", "m2"): 1}
    (masked,) = said(
        thin_human_data(masked_study(), references({"a": 9, "b": 9}, one_short), {"ds": "votes"}), MASKED_NOTE
    )
    assert masked.startswith(
        "humans.csv: 1 of 2 images have fewer than 2 masked descriptions of some mask (m1, m2, m3)"
    )
    assert "spatial dependence is undecided and there is no heat map" in masked and "panel is empty" not in masked
    all_short = {k: 1 for k in enough}
    (masked,) = said(
        thin_human_data(masked_study(), references({"a": 9, "b": 9}, all_short), {"ds": "votes"}), MASKED_NOTE
    )
    assert masked.startswith("humans.csv: 2 of 2 images") and masked.endswith("; the spatial panel is empty")
    two_masks = masked_study({"count": 2})
    (masked,) = said(
        thin_human_data(two_masks, references({"a": 9}, {("a", "m1"): 2, ("a", "m2"): 2}), {}), MASKED_NOTE
    )
    assert masked.startswith("masks: 2 masked variant(s)") and "at least 3 regions" in masked


@pytest.fixture
def thin_study(tmp_path):
    """A study file over two images with one description each and no votes (consensus)."""
    (tmp_path / "imgs").mkdir()
    for i, colour in (("a", (200, 0, 0)), ("b", (0, 200, 0))):
        Image.new("RGB", (16, 16), colour).save(tmp_path / "imgs" / f"{i}.png")
    (tmp_path / "images.csv").write_text("image_id,dataset,file\na,stamps,a.png\nb,stamps,b.png\n")
    (tmp_path / "humans.csv").write_text(
        "description_id,image_id,worker_id,condition,text\nd1,a,w1,full,a red square\nd2,b,w1,full,a green square\n"
    )
    (tmp_path / "c.csv").write_text("image_id,variant,text\na,full,red\nb,full,green\n")
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY))
    return tmp_path / "study.yaml"


def test_validate_warns_and_strict_fails_with_exit_2(thin_study):
    done = CliRunner().invoke(app, ["validate", str(thin_study)])
    output = " ".join(done.output.split())
    assert done.exit_code == 0 and "ok" in output
    assert "2 of 2 images of dataset 'stamps' have 1 description; the consensus rule" in output
    assert "no top- or bottom-ranked human bands for 'stamps'" in output
    done = CliRunner().invoke(app, ["validate", "--strict", str(thin_study)])
    output = " ".join(done.output.split())
    assert done.exit_code == 2 and "(--strict)" in output and "humans.csv: 2 of 2 images" in output
