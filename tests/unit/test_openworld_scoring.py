"""Study B's glue: TI, LI, SS, CS and the outcome of every prediction from a hand-set encoder and the
packaged spaCy model, the scores grouped by granularity for the statistics engine, the open/closed
comparison family, the judge's distinct pairs and why no judge can run."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests import required
from vlm_decade.core.reuse import INPUTS
from vlm_decade.models.api.keys import KEY_ENV
from vlm_decade.studies import study_from_dict
from vlm_decade.studies.openworld.data import LABELS_SCHEMA
from vlm_decade.studies.openworld.judging import judge_unavailable, pairs_to_judge
from vlm_decade.studies.openworld.scoring import (
    ACCEPTED_METRICS,
    METRICS,
    PREDICTIONS_SCHEMA,
    SCORES_B_SCHEMA,
    judgement_key,
    score_predictions,
)
from vlm_decade.studies.openworld.statistics import kinds

spacy = required.module("spacy")

CS_HIGH, LI_HIGH = 0.55, 0.5


def axis_vector(*pairs):
    v = np.zeros(10)
    for axis, value in pairs:
        v[axis] = value
    return v


# Cosines with the label by construction (spaCy's concepts of each prediction in brackets):
# "a red bird" 0.6 ["red bird" 0.7]; "a cardinal" 0.4 ["cardinal" 0.5]; "a tabby cat" 0.9
# ["tabby cat" 0.8]; "sparrow" 0.3 (its only concept is itself).
VECTORS = {
    "scarlet tanager": axis_vector((0, 1.0)),
    "a red bird": axis_vector((0, 0.6), (1, 0.8)),
    "red bird": axis_vector((0, 0.7), (2, 0.51**0.5)),
    "a cardinal": axis_vector((0, 0.4), (3, 0.84**0.5)),
    "cardinal": axis_vector((0, 0.5), (4, 0.75**0.5)),
    "cat": axis_vector((5, 1.0)),
    "a tabby cat": axis_vector((5, 0.9), (6, 0.19**0.5)),
    "tabby cat": axis_vector((5, 0.8), (7, 0.6)),
    "dog": axis_vector((8, 1.0)),
    "sparrow": axis_vector((8, 0.3), (9, 0.91**0.5)),
    "songbird": axis_vector((9, 1.0)),  # an accepted name below: cosine with "sparrow" is 0.91 ** 0.5
}


class HandEncoder:
    """Returns the hand-set vectors (scaled by 2: the caller must normalise); a text it does not know
    fails the test, so an unexpected concept shows."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def __call__(self, texts):
        self.calls.append(list(texts))
        return np.array([2.0 * VECTORS[t] for t in texts])


@pytest.fixture(scope="module")
def nlp():
    from vlm_decade.studies.openworld.metrics import load_nlp

    return load_nlp()


LABELS = pa.table(
    {
        "image_id": ["i1", "i2", "i3"],
        "dataset": ["birds", "pets", "pets"],
        "label": ["scarlet tanager", "cat", "dog"],
        "granularity": ["very fine-grained", "prototypical", "prototypical"],
        "accepted": [[], [], []],
    },
    schema=LABELS_SCHEMA,
)
GRANULARITY = {"birds": "very fine-grained", "pets": "prototypical"}
GROUP_OF = dict(zip(LABELS.column("image_id").to_pylist(), LABELS.column("granularity").to_pylist()))


def response(subject, image_id, prompt_id, text, status="ok"):
    return {"subject": subject, "image_id": image_id, "prompt_id": prompt_id, "text": text, "status": status}


RESPONSES = pa.Table.from_pylist(
    [
        response("m", "i1", "p1", "a red bird"),
        response("m", "i2", "p1", " a tabby cat "),
        response("m", "i3", "p1", "", status="error"),  # failed: left out
        response("n", "i1", "p1", "a cardinal"),
        response("n", "i3", "p1", "sparrow"),
        response("n", "i2", "p2", "a tabby cat"),
    ]
)
JUDGED = {
    ("scarlet tanager", "a red bird", ()): "0",
    ("cat", "a tabby cat", ()): "1",
    ("scarlet tanager", "a cardinal", ()): "0",
    ("dog", "sparrow", ()): " 1\n",
}
# (subject, prompt_id, image_id) -> TI, LI, SS, CS, best concept, outcome; worked from VECTORS:
# CS is the best of the concepts and the whole prediction; high CS is >= 0.55, high LI >= 0.5.
EXPECTED = {
    ("m", "p1", "i1"): (0.0, 0.0, 0.6, 0.7, "red bird", "granularity"),
    ("m", "p1", "i2"): (1.0, 1.0, 0.9, 0.9, "a tabby cat", "correct"),
    ("n", "p1", "i1"): (0.0, 0.0, 0.4, 0.5, "cardinal", "confusion"),
    ("n", "p1", "i3"): (0.0, 1.0, 0.3, 0.3, "sparrow", "ambiguity"),
    ("n", "p2", "i2"): (1.0, 1.0, 0.9, 0.9, "a tabby cat", "correct"),
}


def score(nlp, judged, encoder=None):
    return score_predictions(LABELS, RESPONSES, judged, encoder or HandEncoder(), nlp, CS_HIGH, LI_HIGH)


def test_every_prediction_gets_its_hand_worked_values_and_outcome(nlp):
    encoder = HandEncoder()
    scores, predictions = score(nlp, JUDGED, encoder)
    assert predictions.schema == PREDICTIONS_SCHEMA and scores.schema == SCORES_B_SCHEMA
    rows = predictions.to_pylist()
    assert [(p["subject"], p["prompt_id"], p["image_id"]) for p in rows] == list(EXPECTED)
    for p in rows:
        ti, li, ss, cs, concept, outcome = EXPECTED[(p["subject"], p["prompt_id"], p["image_id"])]
        assert (p["TI"], p["LI"]) == (ti, li)
        assert (p["SS"], p["CS"]) == pytest.approx((ss, cs))
        assert (p["best_concept"], p["outcome"]) == (concept, outcome)
    first = rows[0]
    assert (first["dataset"], first["granularity"], first["label"], first["judge_answer"]) == (
        "birds",
        "very fine-grained",
        "scarlet tanager",
        "0",
    )
    assert rows[1]["prediction"] == " a tabby cat "  # the answer as given, for the reader
    assert len(encoder.calls) == 1  # every text encoded once, together


def test_scores_hold_the_four_metrics_per_prediction_under_the_prompt_id(nlp):
    scores, _ = score(nlp, JUDGED)
    got = {(r["subject"], r["prompt_id"], r["image_id"], r["metric"]): r["value"] for r in scores.to_pylist()}
    want = {
        (s, prompt, image, metric): value
        for (s, prompt, image), values in EXPECTED.items()
        for metric, value in zip(("TI", "LI", "SS", "CS"), values)
    }
    assert got == pytest.approx(want)
    assert {r["dataset"] for r in scores.to_pylist() if r["image_id"] == "i1"} == {"birds"}


def test_without_a_judge_li_is_absent_and_outcomes_unjudged(nlp):
    scores, predictions = score(nlp, None)
    assert set(scores.column("metric").to_pylist()) == {"TI", "SS", "CS"}
    assert scores.num_rows == 3 * len(EXPECTED)
    assert set(predictions.column("outcome").to_pylist()) == {"unjudged"}
    assert predictions.column("LI").null_count == predictions.column("judge_answer").null_count == len(EXPECTED)


def test_a_pair_the_judge_did_not_answer_is_unjudged_alone(nlp):
    judged = {k: v for k, v in JUDGED.items() if k != ("dog", "sparrow", ())}
    scores, predictions = score(nlp, judged)
    outcome = {(p["subject"], p["image_id"]): p["outcome"] for p in predictions.to_pylist()}
    assert outcome[("n", "i3")] == "unjudged" and outcome[("m", "i1")] == "granularity"
    li = {(r["subject"], r["image_id"]) for r in scores.to_pylist() if r["metric"] == "LI"}
    assert ("n", "i3") not in li and len(li) == len(EXPECTED) - 1


# -- accepted names ----------------------------------------------------------------------------------

# i1 also accepts "red bird", i3 "songbird"; i2 has no alternative.
ACCEPTED = LABELS.set_column(4, "accepted", pa.array([["red bird"], [], ["songbird"]], pa.list_(pa.string())))
JUDGED_ACCEPTED = {
    **JUDGED,
    ("scarlet tanager", "a red bird", ("red bird",)): "1",
    ("scarlet tanager", "a cardinal", ("red bird",)): "0",
    ("dog", "sparrow", ("songbird",)): "1",
}
# (subject, prompt_id, image_id) -> TI, LI, SS, CS and best concept over the accepted names, from VECTORS:
# m/i1: "red bird" is in "a red bird" and is its concept (CS 1); SS stays the label's 0.6 (0.7 * 0.6 =
# 0.42 for "red bird"). n/i1: "red bird" scores below the label (SS 0.28, CS 0.35), so the label's values
# stay. n/i3: "songbird" . "sparrow" = 0.91 ** 0.5 for SS and CS, but no inclusion. i2: the label alone.
EXPECTED_ACCEPTED = {
    ("m", "p1", "i1"): (1.0, 1.0, 0.6, 1.0, "red bird"),
    ("m", "p1", "i2"): (1.0, 1.0, 0.9, 0.9, "a tabby cat"),
    ("n", "p1", "i1"): (0.0, 0.0, 0.4, 0.5, "cardinal"),
    ("n", "p1", "i3"): (0.0, 1.0, 0.91**0.5, 0.91**0.5, "sparrow"),
    ("n", "p2", "i2"): (1.0, 1.0, 0.9, 0.9, "a tabby cat"),
}


def test_accepted_names_count_in_ti_and_the_best_name_in_ss_and_cs(nlp):
    encoder = HandEncoder()
    scores, predictions = score_predictions(ACCEPTED, RESPONSES, JUDGED_ACCEPTED, encoder, nlp, CS_HIGH, LI_HIGH)
    assert len(encoder.calls) == 1
    for p in predictions.to_pylist():
        key = (p["subject"], p["prompt_id"], p["image_id"])
        ti, li, ss, cs, concept = EXPECTED_ACCEPTED[key]
        assert (p["TI_accepted"], p["LI_accepted"], p["best_concept_accepted"]) == (ti, li, concept)
        assert (p["SS_accepted"], p["CS_accepted"]) == pytest.approx((ss, cs))
        # The paper's single-label values and outcome are unchanged beside them.
        assert (p["TI"], p["LI"], p["SS"], p["CS"], p["best_concept"], p["outcome"]) == pytest.approx(EXPECTED[key])
    assert predictions.column("accepted").to_pylist() == ["red bird", "", "red bird", "songbird", ""]
    got = {(r["subject"], r["prompt_id"], r["image_id"], r["metric"]): r["value"] for r in scores.to_pylist()}
    want = {
        (s, prompt, image, metric): value
        for (s, prompt, image), values in EXPECTED_ACCEPTED.items()
        for metric, value in zip(ACCEPTED_METRICS, values)
    }
    assert {k: v for k, v in got.items() if k[3] in ACCEPTED_METRICS} == pytest.approx(want)


def test_without_alternatives_the_accepted_values_are_the_papers_and_scores_keep_four_metrics(nlp):
    encoder = HandEncoder()
    scores, predictions = score(nlp, JUDGED, encoder)
    for p in predictions.to_pylist():
        assert [p[f"{m}_accepted"] for m in METRICS] == [p[m] for m in METRICS]  # exactly, not approximately
        assert (p["best_concept_accepted"], p["judge_answer_accepted"]) == (p["best_concept"], p["judge_answer"])
    assert set(scores.column("metric").to_pylist()) == set(METRICS)
    # The encoder sees the texts of the single-label metrics, in their order: labels, predictions, concepts.
    labels = ["scarlet tanager", "cat", "scarlet tanager", "dog", "cat"]
    predictions = ["a red bird", "a tabby cat", "a cardinal", "sparrow", "a tabby cat"]
    concepts = ["red bird", "tabby cat", "cardinal"]
    assert encoder.calls == [list(dict.fromkeys(labels + predictions + concepts))]


def test_a_label_with_alternatives_is_judged_with_and_without_them():
    assert pairs_to_judge(ACCEPTED, RESPONSES.filter(pc.equal(RESPONSES["subject"], "n"))) == [
        ("cat", "a tabby cat", ()),
        ("dog", "sparrow", ()),
        ("dog", "sparrow", ("songbird",)),
        ("scarlet tanager", "a cardinal", ()),
        ("scarlet tanager", "a cardinal", ("red bird",)),
    ]


# -- the pipeline's helpers --------------------------------------------------------------------------

OPEN_WORLD = {"study": "openworld", "name": "b", "data": {"labels": "l.csv", "image_dir": "img", "classnames": "c.csv"}}


def study_b(*models, **extra):
    return study_from_dict(
        {**OPEN_WORLD, "models": [dict(zip(("name", "backend", "model_id"), m)) for m in models], **extra}
    )


def test_models_are_open_or_closed_world_by_backend():
    study = study_b(("vlm2", "hf-vlm", "x"), ("gpt", "openai", "gpt-4o-mini"), ("clip", "hf-zero-shot", "y"))
    assert kinds(study) == {"vlm2": "open-world", "gpt": "open-world", "clip": "closed-world"}


def test_judge_pairs_are_distinct_and_stripped():
    responses = pa.Table.from_pylist(
        [
            response("m", "i2", "p1", " a tabby cat "),
            response("n", "i2", "p1", "a tabby cat"),  # the same pair once stripped
            response("n", "i2", "p2", "a dog"),
            response("m", "i1", "p1", "a bird"),
            response("m", "i3", "p1", "a dog", status="error"),  # failed: never judged
            response("m", "i9", "p1", "a cat"),  # no label
        ]
    )
    assert pairs_to_judge(LABELS, responses) == [
        ("cat", "a dog", ()),
        ("cat", "a tabby cat", ()),
        ("scarlet tanager", "a bird", ()),
    ]


def test_why_no_judge_can_run(monkeypatch, tmp_path):
    models = [("vlm", "hf-vlm", "x")]
    assert "no judge model is configured" in judge_unavailable(study_b(*models, judge=None))
    missing = tmp_path / "no-judge-here"
    assert str(missing) in judge_unavailable(study_b(*models, judge={"path": str(missing)}))
    api_judge = study_b(*models, judge={"backend": "openai", "model_id": "gpt-4o-mini"})
    for name in KEY_ENV["openai"]:
        monkeypatch.delenv(name, raising=False)
    assert "needs an API key" in judge_unavailable(api_judge)
    monkeypatch.setenv(KEY_ENV["openai"][0], "sk-test-not-a-real-key")
    assert judge_unavailable(api_judge) is None


def test_an_imported_file_answers_per_prompt_and_a_row_without_prompt_answers_every_prompt(tmp_path, nlp):
    """An imported model's answers reach the predictions under their own prompt; the answer left without
    a prompt serves both; a (image, prompt) the file lacks is an error response, not a prediction."""
    from vlm_decade.stages.describe.local import DescribeActor
    from vlm_decade.stages.describe.plan import jobs_from, plan_jobs
    from vlm_decade.studies.openworld.pipeline import plan

    answers = tmp_path / "answers.csv"
    answers.write_text(
        "image_id,variant,prompt,text\n"
        "i1,full,p1,a red bird\n"
        "i1,full,p2,a cardinal\n"
        "i2,full,,a tabby cat\n"  # every prompt
        "i3,full,p1,sparrow\n"  # none for p2
    )
    study = study_from_dict(
        {
            "study": "openworld",
            "name": "imported",
            "data": {"image_dir": str(tmp_path), "labels": "labels.csv", "classnames": "classnames.csv"},
            "judge": None,
            "models": [{"name": "m", "backend": "imported", "model_id": "m", "options": {"file": str(answers)}}],
            "prompts": [{"id": "p1", "text": "What is it?"}, {"id": "p2", "text": "Be specific."}],
        }
    )
    images = LABELS.select(["image_id", "dataset"]).append_column("path", pa.array(["x.png"] * 3))
    images = images.append_column("sha256", pa.array(["0" * 64] * 3))
    steps = plan(study, {})
    jobs = jobs_from(plan_jobs(study, steps, images), steps, images)
    responses = pa.Table.from_pylist(DescribeActor(study.models[0]).describe(jobs, None))
    failed = [(r["image_id"], r["prompt_id"], r["error"]) for r in responses.to_pylist() if r["status"] != "ok"]
    assert failed == [("i3", "p2", "no description for (i3, full, prompt p2) in the file")]
    _, predictions = score_predictions(LABELS, responses, None, HandEncoder(), nlp, CS_HIGH, LI_HIGH)
    got = {(p["prompt_id"], p["image_id"]): (p["prediction"], round(p["CS"], 9)) for p in predictions.to_pylist()}
    # CS of each answer as worked by hand from VECTORS above (EXPECTED)
    assert got == {
        ("p1", "i1"): ("a red bird", 0.7),
        ("p2", "i1"): ("a cardinal", 0.5),
        ("p1", "i2"): ("a tabby cat", 0.9),
        ("p2", "i2"): ("a tabby cat", 0.9),
        ("p1", "i3"): ("sparrow", 0.3),
    }


# -- incremental runs: only new or changed predictions are scored -------------------------------------

ANIMALS = ("cat", "dog", "owl", "fox", "hare", "wren")
GROWN_LABELS = pa.table(
    {
        "image_id": [f"g{k}" for k in range(len(ANIMALS))],
        "dataset": ["pets", "pets", "birds", "wild", "wild", "birds"],
        "label": list(ANIMALS),
        "granularity": ["prototypical", "prototypical", "fine-grained", "coarse", "coarse", "fine-grained"],
        "accepted": [[], [], ["barn owl"], [], [], []],
    },
    schema=LABELS_SCHEMA,
)
SETTINGS = ["encoder settings", "spaCy model"]


def grown_responses(images: int, texts: dict | None = None) -> pa.Table:
    """Each model's answer under each prompt for the first `images` images, every text distinct (so the
    texts spaCy is given name the predictions scored); `texts` replaces some by (subject, image, prompt)."""
    rows = []
    for subject in ("m", "n"):
        for k, animal in enumerate(ANIMALS[:images]):
            for prompt in ("p1", "p2"):
                text = (
                    f"a {animal} seen by {subject} {prompt}"
                    if k % 2
                    else f"{subject} thinks of thing {k} under {prompt}"
                )
                rows.append(response(subject, f"g{k}", prompt, (texts or {}).get((subject, f"g{k}", prompt), text)))
    return pa.Table.from_pylist(rows)


def judge_all(labels: pa.Table, responses: pa.Table, changed: dict | None = None) -> dict:
    """A judge answer for every question about `responses`: "1" when the label's first letter opens a word."""
    return {
        key: (changed or {}).get(key, str(int(f" {key[0][0]}" in f" {key[1]}")))
        for key in pairs_to_judge(labels, responses)
    }


class CountingEncoder:
    """A vector per text from its own hash alone (so a text's vector is the same whatever else is encoded
    with it), recording the texts it was given."""

    def __init__(self):
        self.texts: list[str] = []

    def __call__(self, texts):
        self.texts += texts
        return np.array([np.random.default_rng(list(t.encode())).normal(size=8) for t in texts])


class CountingNlp:
    """The spaCy pipeline, recording the predictions it was given."""

    def __init__(self, nlp):
        self.nlp, self.texts = nlp, []

    def pipe(self, texts):
        texts = list(texts)
        self.texts += texts
        return self.nlp.pipe(texts)


def scored(nlp, labels, responses, judged, previous=None, settings=SETTINGS):
    """(scores, predictions, texts encoded, predictions given to spaCy) of one run of the score stage."""
    encoder, counted = CountingEncoder(), CountingNlp(nlp)
    scores, predictions = score_predictions(
        labels, responses, judged, encoder, counted, CS_HIGH, LI_HIGH, previous, settings
    )
    return scores, predictions, encoder.texts, counted.texts


def fresh(nlp, labels, responses, judged, settings=SETTINGS):
    return scored(nlp, labels, responses, judged, settings=settings)[:2]


def assert_same_tables(got, want):
    """The tables of an incremental run against a fresh run's. The counting encoder gives a text one vector
    whatever it is encoded with, so even the floats are equal exactly (a real encoder's may differ in
    the last bits)."""
    for table, fresh_table in zip(got, want):
        assert table.schema == fresh_table.schema
        assert table.equals(fresh_table), table.to_pylist()


def test_images_added_to_a_run_are_the_only_ones_encoded_and_the_tables_equal_a_fresh_run(nlp):
    first = grown_responses(4)
    _, old, _, _ = scored(nlp, GROWN_LABELS, first, judge_all(GROWN_LABELS, first))
    grown = grown_responses(6)
    judged = judge_all(GROWN_LABELS, grown)
    scores, predictions, encoded, piped = scored(nlp, GROWN_LABELS, grown, judged, old)
    new = grown.filter(pc.is_in(grown["image_id"], pa.array(["g4", "g5"])))
    _, _, alone, alone_piped = scored(nlp, GROWN_LABELS, new, judged)  # the new predictions scored by themselves
    assert encoded == alone and piped == alone_piped == new.column("text").to_pylist()
    assert "cat" not in encoded and "owl" not in encoded  # labels of kept predictions are not encoded again
    assert_same_tables((scores, predictions), fresh(nlp, GROWN_LABELS, grown, judged))
    assert predictions.num_rows == 2 * 6 * 2 and set(scores.column("metric").to_pylist()) == set(
        METRICS + ACCEPTED_METRICS
    )


def test_a_changed_response_label_or_judge_answer_is_scored_again_and_nothing_else(nlp):
    responses = grown_responses(6)
    _, old, _, _ = scored(nlp, GROWN_LABELS, responses, judge_all(GROWN_LABELS, responses))
    changed_text = grown_responses(6, {("m", "g1", "p2"): "a dog or a wolf"})
    relabelled = GROWN_LABELS.set_column(2, "label", pa.array(["cat", "dog", "owl", "fox", "rabbit", "wren"]))
    answered = {judgement_key("wren", "a wren seen by n p1"): "0"}  # it answered "1" before
    judged = judge_all(relabelled, changed_text, answered)
    scores, predictions, _, piped = scored(nlp, relabelled, changed_text, judged, old)
    assert sorted(piped) == sorted(
        ["a dog or a wolf", "a wren seen by n p1"]
        + [f"{s} thinks of thing 4 under {p}" for s in ("m", "n") for p in ("p1", "p2")]  # g4, now a rabbit
    )
    assert_same_tables((scores, predictions), fresh(nlp, relabelled, changed_text, judged))
    row = next(p for p in predictions.to_pylist() if (p["subject"], p["image_id"], p["prompt_id"]) == ("n", "g5", "p1"))
    assert (row["judge_answer"], row["LI"]) == ("0", 0.0)


def test_a_label_given_an_alternative_rescores_its_predictions_and_scores_gain_the_accepted_metrics(nlp):
    labels = GROWN_LABELS.set_column(4, "accepted", pa.array([[]] * 6, pa.list_(pa.string())))
    responses = grown_responses(6)
    scores, old, _, _ = scored(nlp, labels, responses, judge_all(labels, responses))
    assert set(scores.column("metric").to_pylist()) == set(METRICS)
    judged = judge_all(GROWN_LABELS, responses)  # g2, the owl, also accepts "barn owl"
    scores, predictions, _, piped = scored(nlp, GROWN_LABELS, responses, judged, old)
    assert sorted(piped) == sorted(f"{s} thinks of thing 2 under {p}" for s in ("m", "n") for p in ("p1", "p2"))
    assert_same_tables((scores, predictions), fresh(nlp, GROWN_LABELS, responses, judged))


def test_a_previous_table_of_the_old_schema_or_other_settings_is_scored_again_whole(nlp):
    responses = grown_responses(6)
    judged = judge_all(GROWN_LABELS, responses)
    _, old, _, _ = scored(nlp, GROWN_LABELS, responses, judged)
    everything = sorted(responses.column("text").to_pylist())
    before_the_hash = old.drop_columns([INPUTS])  # a run folder written before predictions carried it
    for previous, settings in ((before_the_hash, SETTINGS), (old, ["another encoder", "spaCy model"])):
        scores, predictions, _, piped = scored(nlp, GROWN_LABELS, responses, judged, previous, settings)
        assert sorted(piped) == everything
        assert_same_tables((scores, predictions), fresh(nlp, GROWN_LABELS, responses, judged, settings))
    _, _, encoded, piped = scored(nlp, GROWN_LABELS, responses, judged, old)
    assert encoded == piped == []  # nothing new: neither the encoder nor spaCy is asked anything
    no_judge = scored(nlp, GROWN_LABELS, responses, None, old)
    assert sorted(no_judge[3]) == everything and set(no_judge[1].column("outcome").to_pylist()) == {"unjudged"}
