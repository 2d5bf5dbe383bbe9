"""The human experiments' designs (studies/decade/human/design.py): the paper's counts and the
balance properties on a ranking design of the paper's size, hand-checked small cases, and the seed."""

from __future__ import annotations

import csv
import json
from collections import Counter, defaultdict

import numpy as np
import pytest
from PIL import Image

from vlm_decade.studies.decade.human.design import (
    DESIGN_COLUMNS,
    describe_design,
    experiment_id,
    rank_design,
    rate_design,
    write_experiment,
)


def _corpus(n_images: int, per_image: int, datasets: int = 1):
    descriptions = {f"i{i:03d}": [f"i{i:03d}-d{j:02d}" for j in range(per_image)] for i in range(n_images)}
    dataset_of = {image: f"set{k % datasets}" for k, image in enumerate(descriptions)}
    texts = {d: f"text of {d}" for ids in descriptions.values() for d in ids}
    return descriptions, dataset_of, texts


@pytest.fixture(scope="module")
def paper():
    """The paper's ranking experiment: 200 images x 20 descriptions, 5 + 2 a trial, 50 participants."""
    descriptions, dataset_of, texts = _corpus(200, 20)
    return descriptions, dataset_of, rank_design(descriptions, dataset_of, texts, seed=7)


def _image_of(description_id: str) -> str:
    return description_id.split("-")[0]


def test_the_papers_counts(paper):
    descriptions, _, design = paper
    rows = design.rows
    by_participant = Counter(r["participant"] for r in rows)
    assert len(by_participant) == 50
    assert set(by_participant.values()) == {800}  # 200 images x 4 splits
    assert design.parameters["splits"] == 4
    for r in rows:
        options, others = r["options"].split(";"), r["distractors"].split(";")
        assert len(options) == 7 and len(others) == 2 and set(others) <= set(options)
        own = [o for o in options if o not in others]
        assert len(own) == 5 and all(_image_of(o) == r["image_id"] for o in own)
        assert all(_image_of(o) != r["image_id"] for o in others)
    # trials numbered 1..800 within each participant
    trials = defaultdict(list)
    for r in rows:
        trials[r["participant"]].append(r["trial"])
    assert all(sorted(t) == list(range(1, 801)) for t in trials.values())


def test_the_papers_balance(paper):
    descriptions, _, design = paper
    rows = design.rows
    shown = Counter()
    splits = defaultdict(set)
    per_participant_image = defaultdict(list)
    distractors = defaultdict(list)
    for r in rows:
        others = r["distractors"].split(";")
        own = frozenset(o for o in r["options"].split(";") if o not in others)
        shown.update(own)
        per_participant_image[(r["participant"], r["image_id"])].append(own)
        distractors[r["participant"]] += others
    # every description shown equally often: once per participant
    assert set(shown.values()) == {50} and len(shown) == 4000
    # each participant's groups of an image are a split of its 20 descriptions
    for (_, image), groups in per_participant_image.items():
        assert sorted(d for g in groups for d in g) == sorted(descriptions[image])
        splits[image].add(frozenset(groups))
    # a distinct split for every participant
    assert all(len(s) == 50 for s in splits.values())
    # distractors never repeated within a participant
    assert all(len(d) == len(set(d)) == 1600 for d in distractors.values())
    # trial order randomised per participant: the images' orders differ
    orders = {tuple(r["image_id"] for r in rows if r["participant"] == p) for p in ("p001", "p002", "p003")}
    assert len(orders) == 3


def test_distractors_come_from_the_same_dataset():
    descriptions, dataset_of, texts = _corpus(6, 4, datasets=2)
    design = rank_design(descriptions, dataset_of, texts, shown=2, distractors=1, participants=3, seed=1)
    for r in design.rows:
        (other,) = r["distractors"].split(";")
        assert dataset_of[_image_of(other)] == dataset_of[r["image_id"]]
    assert set(design.texts) == {o for r in design.rows for o in r["options"].split(";")}


def test_a_window_of_descriptions_is_shown_equally_often_to_within_one():
    # 7 descriptions, 1 split of 3: participant p sees a window of 3 moving round by 3
    descriptions, dataset_of, texts = _corpus(3, 7)
    design = rank_design(descriptions, dataset_of, texts, shown=3, distractors=1, splits=1, participants=5, seed=3)
    shown = Counter(o for r in design.rows for o in r["options"].split(";") if o not in r["distractors"].split(";"))
    for image in descriptions:
        counts = [shown[d] for d in descriptions[image]]
        assert sum(counts) == 15 and max(counts) - min(counts) <= 1  # 5 participants x 3 = 2,2,2,2,2,2,3


def test_too_few_distractors_is_said():
    descriptions, dataset_of, texts = _corpus(2, 2)  # each image's distractors: the other's 2 descriptions
    with pytest.raises(ValueError, match="too few descriptions"):
        rank_design(descriptions, dataset_of, texts, shown=1, distractors=2, participants=1)


def test_describe_by_hand():
    # 3 images, 2 descriptions each, 2 conditions, 2 images a participant: per replicate 2 groups of
    # 3 images, cut into 2 + 1 -> 2 replicates x 2 groups x 2 sessions = 8 participants
    design = describe_design(["a", "b", "c"], per_image=2, per_participant=2, conditions=("full", "m1"), seed=5)
    rows = design.rows
    assert len({r["participant"] for r in rows}) == 8 == design.parameters["participants"]
    assert Counter((r["image_id"], r["condition"]) for r in rows) == {(i, c): 2 for i in "abc" for c in ("full", "m1")}
    seen = defaultdict(list)
    for r in rows:
        seen[r["participant"]].append(r["image_id"])
    assert all(len(v) == len(set(v)) for v in seen.values())  # never one image in two conditions
    assert all(r["kind"] == "describe" and r["options"] == "" for r in rows)
    checked = describe_design(
        ["a", "b", "c"], per_image=2, per_participant=3, conditions=("full", "m1"), attention_rate=1
    )
    seen = defaultdict(set)
    for r in checked.rows:
        seen[(r["participant"], r["image_id"])].add(r["condition"])
    assert all(len(c) == 1 for c in seen.values())  # an attention check shows the image as its trial does


def test_attention_checks_at_the_rate():
    design = describe_design(["a", "b", "c", "d"], per_image=1, per_participant=4, attention_rate=0.5, seed=1)
    (pid,) = {r["participant"] for r in design.rows}
    checks = [r for r in design.rows if r["kind"] == "attention"]
    assert len(checks) == 2 and all(r["answer"] == "lantern" and "lantern" in r["text"] for r in checks)
    assert sorted(r["trial"] for r in design.rows) == list(range(1, 7))


def test_rate_by_hand():
    pairs = [{"subject": s, "image_id": i, "text": f"{s} on {i}", "gold": f"gold {i}"} for s in "xy" for i in "ab"]
    design = rate_design(pairs, raters=3, per_rater=2, seed=2)
    counts = Counter((r["subject"], r["image_id"]) for r in design.rows)
    assert sum(counts.values()) == 6 and set(counts.values()) == {1, 2}  # 6 ratings over 4 pairs
    assert all(
        r["text"] == f"{r['subject']} on {r['image_id']}" and r["gold"] == f"gold {r['image_id']}" for r in design.rows
    )
    full = rate_design(pairs, raters=2, seed=2, attention_rate=0.25)
    assert Counter(r["kind"] for r in full.rows) == {"rate": 8, "attention": 2}
    assert {r["answer"] for r in full.rows if r["kind"] == "attention"} == {5}


def test_same_seed_same_design_other_seed_another():
    descriptions, dataset_of, texts = _corpus(5, 10)
    one = rank_design(descriptions, dataset_of, texts, participants=4, seed=11).rows
    assert one == rank_design(descriptions, dataset_of, texts, participants=4, seed=11).rows
    assert one != rank_design(descriptions, dataset_of, texts, participants=4, seed=12).rows
    a = describe_design(list("abcdef"), per_image=2, per_participant=3, seed=1).rows
    assert a == describe_design(list("abcdef"), per_image=2, per_participant=3, seed=1).rows
    assert a != describe_design(list("abcdef"), per_image=2, per_participant=3, seed=2).rows


def test_the_experiment_folder(tmp_path):
    descriptions, dataset_of, texts = _corpus(3, 4)
    images, pixels = {}, {}
    (tmp_path / "src").mkdir()
    for k, image in enumerate(descriptions):
        # i002 is a TIFF, which browsers do not show: it is written as PNG, pixel for pixel
        images[image] = tmp_path / "src" / (f"{image}.PNG" if image != "i002" else f"{image}.tif")
        pixels[image] = np.full((6, 8, 3), (40 * k, 90, 200 - 40 * k), np.uint8)
        Image.fromarray(pixels[image]).save(images[image], format="PNG" if image != "i002" else "TIFF")
    design = rank_design(descriptions, dataset_of, texts, shown=2, distractors=1, participants=2, seed=4)
    out = tmp_path / "exp"
    meta = write_experiment(design, images, out, seed=4)
    with open(out / "design.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert tuple(table[0]) == DESIGN_COLUMNS and len(table) == 2 * 3 * 2
    assert {r["image"] for r in table} == {f"{i}.png" for i in descriptions}
    assert (out / "images" / "i001.png").read_bytes() == images["i001"].read_bytes()  # a browser's format, as it is
    for image in descriptions:
        with Image.open(out / "images" / f"{image}.png") as shown_image:
            assert shown_image.format == "PNG" and np.array_equal(np.asarray(shown_image), pixels[image])
    assert meta["experiment_id"] == experiment_id((out / "design.csv").read_bytes())
    assert json.loads((out / "experiment.json").read_text())["counts"]["trials"] == 12
    with open(out / "texts.csv", newline="") as fh:
        shown = {r["description_id"]: r["text"] for r in csv.DictReader(fh)}
    assert shown == {d: texts[d] for d in shown} and len(shown) == 12


def test_splits_repeat_only_once_the_distinct_ones_run_out():
    # 4 descriptions in 2 groups of 2 have 3 distinct splits: 3 participants get all three
    descriptions, dataset_of, texts = _corpus(3, 4)
    rows = rank_design(descriptions, dataset_of, texts, shown=2, distractors=1, participants=5, seed=8).rows
    splits = {}
    for r in rows:
        if r["image_id"] == "i000":
            own = tuple(sorted(o for o in r["options"].split(";") if o not in r["distractors"].split(";")))
            splits.setdefault(r["participant"], set()).add(own)
    first_three = [frozenset(splits[p]) for p in ("p001", "p002", "p003")]
    assert len(set(first_three)) == 3 and len(splits) == 5
