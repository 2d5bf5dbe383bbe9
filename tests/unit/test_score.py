"""Similarity to the gold standard, checked on hand-made vectors whose cosines are known."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from vlm_decade.core.runfolder import RunFolder
from vlm_decade.models.encoders import text_key
from vlm_decade.stages.embed import EMBEDDINGS_SCHEMA
from vlm_decade.studies.decade import score
from vlm_decade.studies.decade.score import similarity_scores

VECTORS = {  # text -> vector; cosines worked by hand below
    "gold one": [1.0, 0.0, 0.0],
    "top a": [1.0, 1.0, 0.0],  # cos 1/sqrt(2) to gold one
    "top b": [1.0, 0.0, 0.0],  # cos 1
    "bottom a": [0.0, 1.0, 0.0],  # cos 0
    "model says": [3.0, 4.0, 0.0],  # cos 0.6
    "gold two": [0.0, 0.0, 2.0],
    "model two": [0.0, 1.0, -1.0],  # cos -1/sqrt(2)
}


def _tables():
    images = pa.table({"image_id": ["i1", "i2"], "dataset": ["d1", "d2"]})
    refs = pa.table(
        {
            "image_id": ["i1", "i1", "i1", "i1", "i1", "i2"],
            "condition": ["full", "full", "full", "full", "m1", "full"],
            "role": ["gold", "top", "top", "bottom", "masked", "gold"],
            "text": ["gold one", "top a", "top b", "bottom a", "top a", "gold two"],
        }
    )
    responses = pa.table(
        {
            "subject": ["m", "m", "m", "m"],
            "image_id": ["i1", "i1", "i2", "i2"],
            "variant": ["full", "m1", "full", "m2"],
            "status": ["ok", "ok", "ok", "error"],
            "text": ["model says", "top b", "model two", ""],
        }
    )
    emb = pa.Table.from_pylist(
        [
            {
                "text_sha256": text_key(t),
                "encoder": "E",
                "encoder_key": "k",
                "dim": 3,
                "vector": np.asarray(v, np.float32) * 2,
            }
            for t, v in VECTORS.items()
        ],
        schema=EMBEDDINGS_SCHEMA,
    )
    return images, refs, responses, emb


def test_similarities_match_hand_worked_cosines():
    scores = similarity_scores(*_tables(), ["E"])
    got = {(r["subject"], r["image_id"]): (r["value"], r["dataset"], r["variant"]) for r in scores.to_pylist()}
    assert got[("m", "i1")][0] == pytest.approx(0.6)
    assert got[("m", "i2")][0] == pytest.approx(-1 / np.sqrt(2))
    assert got[("human:top", "i1")][0] == pytest.approx((1 / np.sqrt(2) + 1) / 2)
    assert got[("human:bottom", "i1")][0] == pytest.approx(0.0, abs=1e-7)
    assert got[("m", "i2")][1:] == ("d2", "full")
    # Masked variants and failed responses are not scored against the gold standard.
    assert len(got) == 4


class _Length:
    """A pairwise metric with known values: candidate length minus reference length."""

    name = "LEN"

    def score(self, candidates, references):
        return np.array([len(c) - len(r) for c, r in zip(candidates, references)], dtype=float)


def test_pairwise_metrics_score_the_same_pairs_and_humans_average():
    scores = similarity_scores(*_tables(), ["E"], pair_metrics=[_Length()])
    got = {(r["subject"], r["image_id"]): r["value"] for r in scores.to_pylist() if r["metric"] == "LEN"}
    assert got[("m", "i1")] == len("model says") - len("gold one")
    assert got[("human:top", "i1")] == ((len("top a") - 8) + (len("top b") - 8)) / 2
    assert len(got) == 4


class _Counted(_Length):
    """The pairwise metric, counting the pairs it scores."""

    def __init__(self):
        self.pairs = 0

    def score(self, candidates, references):
        self.pairs += len(candidates)
        return super().score(candidates, references)


def test_an_added_image_is_the_only_one_scored_and_the_scores_equal_a_fresh_run():
    images, refs, responses, emb = _tables()
    first = images.slice(0, 1)  # i1 alone, then i2 added
    only_i1 = [t.filter(pa.compute.equal(t.column("image_id"), "i1")) for t in (refs, responses)]
    before = similarity_scores(first, *only_i1, emb, ["E"], [_Counted()], settings="s")
    metric = _Counted()
    grown = similarity_scores(images, refs, responses, emb, ["E"], [metric], previous=before, settings="s")
    assert metric.pairs == 1  # the model's description of i2; i1's four pairs were kept
    fresh = similarity_scores(images, refs, responses, emb, ["E"], [_Counted()], settings="s")
    assert grown.equals(fresh)
    again = _Counted()
    changed = similarity_scores(images, refs, responses, emb, ["E"], [again], previous=before, settings="t")
    assert again.pairs == 5 and changed.drop_columns(["inputs_sha256"]).equals(fresh.drop_columns(["inputs_sha256"]))


def _vector(name: str, dim: int) -> np.ndarray:
    """A random vector of its own for each name, whatever else a study holds."""
    return np.random.default_rng(int(text_key(name)[:12], 16)).normal(size=dim).astype(np.float32)


def _study(n: int, dim: int = 16, changed=()):
    """n images with random vectors: two human groups, two models (one failing on some images), a
    masked condition, every fifth image without a gold standard, every fourth without an ok
    response; the images of `changed` with another top description. Embeddings of two encoders, in
    several batches."""
    images = pa.table({"image_id": [f"img{i:03d}" for i in range(n)], "dataset": [f"d{i % 3}" for i in range(n)]})
    refs, responses, texts = [], [], set()
    for i, image_id in enumerate(images.column("image_id").to_pylist()):
        roles = (["gold"] if i % 5 != 4 else []) + ["top", "top", "bottom", "bottom"]
        for k, role in enumerate(roles):
            text = f"{image_id} {role} {k}" + (" again" if i in changed and role == "top" else "")
            refs.append({"image_id": image_id, "condition": "full", "role": role, "text": text})
            texts.add(text)
        refs.append({"image_id": image_id, "condition": "m1", "role": "masked", "text": f"{image_id} masked"})
        for subject in ("m", "n"):
            ok = not (i % 4 == 3 and subject == "n") and i % 8 != 7
            for variant in ("full", "m1"):
                text = f"{image_id} {subject} {variant}" if i % 6 else "a text two models share"
                responses.append(
                    {"subject": subject, "image_id": image_id, "variant": variant, "status": "ok" if ok else "error"}
                    | {"text": text if ok else ""}
                )
                texts.add(text)
    vectors = {(t, e): _vector(f"{e} {t}", dim) for t in sorted(texts) for e in ("E", "F")}
    rows = [
        {"text_sha256": text_key(t), "encoder": e, "encoder_key": e, "dim": dim, "vector": v}
        for (t, e), v in vectors.items()
    ]
    rows.sort(key=lambda r: (r["encoder"], r["text_sha256"]))
    emb = pa.Table.from_pylist(rows, schema=EMBEDDINGS_SCHEMA)
    emb = pa.concat_tables([emb.slice(i, 5) for i in range(0, emb.num_rows, 5)])
    return images, pa.Table.from_pylist(refs), pa.Table.from_pylist(responses), emb, vectors


def _reference_means(refs, responses, vectors) -> dict:
    """(metric, subject, image_id) -> mean cosine to the gold standard, straight from the vectors."""
    gold = {r["image_id"]: r["text"] for r in refs.to_pylist() if r["role"] == "gold" and r["condition"] == "full"}
    members = {}
    for r in refs.to_pylist():
        if r["condition"] == "full" and r["role"] in ("top", "bottom"):
            members.setdefault((f"human:{r['role']}", r["image_id"]), []).append(r["text"])
    for r in responses.to_pylist():
        if r["status"] == "ok" and r["variant"] == "full":
            members.setdefault((r["subject"], r["image_id"]), []).append(r["text"])
    means = {}
    for (subject, image_id), candidates in members.items():
        if image_id not in gold:
            continue
        for e in ("E", "F"):
            g = vectors[(gold[image_id], e)].astype(np.float64)
            cosines = [
                np.dot(c, g) / np.linalg.norm(c) / np.linalg.norm(g)
                for c in (vectors[(t, e)].astype(np.float64) for t in candidates)
            ]
            means[(e, subject, image_id)] = float(np.mean(cosines))
    return means


@pytest.mark.parametrize("shard", [1, 2, 3, 5])
def test_scores_are_the_same_whatever_the_shard_size_and_match_the_vectors(monkeypatch, shard):
    images, refs, responses, emb, vectors = _study(11)
    whole = similarity_scores(images, refs, responses, emb, ["E", "F"], settings="s")
    monkeypatch.setattr(score, "SHARD_IMAGES", shard)
    monkeypatch.setattr(score, "PYTHON_ROWS", 4)  # and the pairs' inputs hashed a few images at a time
    sharded = similarity_scores(images, refs, responses, emb, ["E", "F"], settings="s")
    assert sharded.equals(whole)
    expected = _reference_means(refs, responses, vectors)
    got = {(r["metric"], r["subject"], r["image_id"]): r["value"] for r in sharded.to_pylist()}
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)
    # Images without a gold standard have no rows; one without an ok response has its humans' only.
    assert not {"img004", "img009"} & {image_id for _, _, image_id in got}
    assert {s for _, s, i in got if i == "img007"} == {"human:top", "human:bottom"}
    assert sorted(got) == [tuple(r.values()) for r in sharded.select(["metric", "subject", "image_id"]).to_pylist()]


def test_shards_rescore_only_the_changed_and_added_images_and_equal_a_fresh_run(monkeypatch):
    monkeypatch.setattr(score, "SHARD_IMAGES", 3)
    before = similarity_scores(*_study(8)[:4], ["E"], [_Counted()], settings="s")
    images, refs, responses, emb, _ = _study(10, changed={2, 5})
    metric = _Counted()
    grown = similarity_scores(images, refs, responses, emb, ["E"], [metric], previous=before, settings="s")
    fresh = similarity_scores(images, refs, responses, emb, ["E"], [_Counted()], settings="s")
    assert grown.equals(fresh)
    # img002 and img005 changed (4 humans, 2 models each), img008 is new (4 humans, its models'
    # full descriptions), img009 is new but has no gold standard.
    assert metric.pairs == 6 + 6 + 6
    monkeypatch.setattr(score, "SHARD_IMAGES", 100)
    assert similarity_scores(images, refs, responses, emb, ["E"], [_Counted()], settings="s").equals(fresh)


@pytest.mark.parametrize(("text", "pairs"), [("img002 gold 0", 6), ("img002 m full", 1)])
def test_a_gold_standard_or_a_description_without_a_vector_is_an_error(monkeypatch, text, pairs):
    monkeypatch.setattr(score, "SHARD_IMAGES", 3)
    images, refs, responses, emb, _ = _study(6)
    emb = emb.filter(pa.compute.not_equal(emb.column("text_sha256"), text_key(text)))
    with pytest.raises(RuntimeError, match=f"^{pairs} pairs have no E vector"):
        similarity_scores(images, refs, responses, emb, ["E"])


@pytest.mark.parametrize("shard", [1, 4, 100])
def test_the_embeddings_are_read_once_per_encoder_whatever_the_shards_and_not_at_all_when_all_is_kept(
    monkeypatch, shard
):
    monkeypatch.setattr(score, "SHARD_IMAGES", shard)
    images, refs, responses, emb, _ = _study(11)
    passes = []
    read = score._row_groups

    def counted(embeddings):
        passes.append(1)
        yield from read(embeddings)

    monkeypatch.setattr(score, "_row_groups", counted)
    first = similarity_scores(images, refs, responses, emb, ["E", "F"], settings="s")
    assert len(passes) == 2  # one per encoder
    again = similarity_scores(images, refs, responses, emb, ["E", "F"], previous=first, settings="s")
    assert again.equals(first) and len(passes) == 2


def test_images_added_read_the_vectors_of_the_groups_holding_their_texts_only(monkeypatch):
    """The embeddings as a run with images added leaves them: the first run's vectors, then the
    added texts' (a segment of their own); only groups holding added texts have their vectors read."""
    images, refs, responses, emb, _ = _study(8)
    before = similarity_scores(images, refs, responses, emb, ["E"], settings="s")
    images, refs, responses, grown, _ = _study(10)
    fresh = similarity_scores(images, refs, responses, grown, ["E"], settings="s")
    old = emb.combine_chunks()
    added = grown.filter(pa.compute.invert(pa.compute.is_in(grown.column("text_sha256"), old.column("text_sha256"))))
    old = pa.concat_tables([old.slice(at, 4) for at in range(0, old.num_rows, 4)])  # groups of four rows
    old_groups = len(old.to_batches())
    read = score._row_groups
    vectors_read = []

    def recorded(embeddings):
        for k, group in enumerate(read(embeddings)):

            def columns_of(columns, k=k, group=group):
                if "vector" in columns:
                    vectors_read.append(k)
                return group(columns)

            yield columns_of

    monkeypatch.setattr(score, "_row_groups", recorded)
    after = similarity_scores(
        images, refs, responses, pa.concat_tables([old, added]), ["E"], previous=before, settings="s"
    )
    assert after.equals(fresh)
    assert vectors_read and min(vectors_read) >= old_groups


@pytest.mark.parametrize("changed", [set(), {6}])
def test_the_newest_segment_is_read_first_and_the_older_ones_only_for_what_it_lacks(monkeypatch, tmp_path, changed):
    """The embeddings as a run with images added leaves them in its run folder: the first run's
    segment, then the added texts'. The added images' texts are all in the newest: the older
    segment's keys are not read at all. An image whose top description changed needs its other
    texts' vectors from the older one too: it is read, and the scores are a fresh run's."""
    images, refs, responses, emb, _ = _study(8)
    before = similarity_scores(images, refs, responses, emb, ["E"], settings="s")
    images, refs, responses, grown, _ = _study(10, changed=changed)
    fresh = similarity_scores(images, refs, responses, grown, ["E"], settings="s")
    old = emb.combine_chunks()
    added = grown.filter(pa.compute.invert(pa.compute.is_in(grown.column("text_sha256"), old.column("text_sha256"))))
    folder = RunFolder(tmp_path)
    for number, segment in enumerate([old, added], 1):
        batches = segment.combine_chunks().to_batches(max_chunksize=4)
        folder.write_segment("embeddings", number, EMBEDDINGS_SCHEMA, batches, row_group_rows=4)
    newest_groups = len(added.combine_chunks().to_batches(max_chunksize=4))
    keys_read = []
    read = score._row_groups

    def recorded(embeddings):
        for k, group in enumerate(read(embeddings)):
            keys_read.append(k)
            yield group

    monkeypatch.setattr(score, "_row_groups", recorded)
    after = similarity_scores(images, refs, responses, folder, ["E"], previous=before, settings="s")
    assert after.equals(fresh)
    if changed:
        assert max(keys_read) >= newest_groups  # into the older segment
    else:
        assert keys_read and max(keys_read) < newest_groups


@pytest.mark.parametrize("held", [True, False])
def test_the_run_folder_s_tables_are_streamed_into_shards_and_score_as_the_tables_do(monkeypatch, tmp_path, held):
    """At a million images the texts are gigabytes: they are read from the run folder a batch at a
    time (batches that straddle shards), never whole, and give the same table as when held; their
    shards are held in memory when the files are small, else spread over files."""
    monkeypatch.setattr(score, "HOLD_FILES_BYTES", 2**40 if held else -1)
    images, refs, responses, emb, _ = _study(10, changed={2, 5})
    before = similarity_scores(*_study(8)[:4], ["E"], [_Counted()], settings="s")
    held = similarity_scores(images, refs, responses, emb, ["E"], [_Counted()], previous=before, settings="s")
    folder = RunFolder(tmp_path)
    for name, table in [("references", refs), ("responses", responses), ("embeddings", emb), ("scores", before)]:
        folder.write(name, table)

    def whole(self, name):
        raise AssertionError(f"{name} was read whole")

    monkeypatch.setattr(RunFolder, "read", whole)
    monkeypatch.setattr(score, "SHARD_IMAGES", 3)
    monkeypatch.setattr(score, "EMBEDDING_BATCH", 7)
    metric = _Counted()
    streamed = similarity_scores(images, folder, folder, folder, ["E"], [metric], previous=folder, settings="s")
    assert streamed.equals(held)
    assert metric.pairs == 6 + 6 + 6  # the kept rows were found in the streamed scores: as in the test above
    assert not (tmp_path / ".spill").exists() or not any((tmp_path / ".spill").iterdir())


NAME = st.text(alphabet=st.sampled_from(list('ab"\\\x01é中 ')), max_size=4)


@hsettings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["i1", "i2", "i3"]), NAME, NAME, NAME), min_size=1, max_size=12),
    st.dictionaries(st.sampled_from(["i1", "i2", "i3"]), st.none() | NAME),
    st.booleans(),
)
def test_an_image_s_inputs_are_the_hash_unit_inputs_gives_its_dataset_gold_and_pairs(rows, datasets, texts):
    """The hash each scores row carries, as runs before computed it: `unit_inputs` of
    (dataset, gold, [[subject, candidate], ...]) per image, its JSON put together in Python."""
    from vlm_decade.core.reuse import INPUTS, unit_inputs

    gold_of = {}
    for image_id, _, _, gold in rows:
        gold_of.setdefault(image_id, gold)  # one gold standard per image
    rows = sorted((i, s, c, gold_of[i]) for i, s, c, _ in rows)
    candidate, gold = ("candidate", "gold") if texts else ("candidate_key", "gold_key")
    pairs = pa.table({k: [r[j] for r in rows] for j, k in enumerate(["image_id", "subject", candidate, gold])})
    images = pa.table(
        {"image_id": pa.array(list(datasets), pa.string()), "dataset": pa.array(list(datasets.values()), pa.string())}
    )
    settings = [1, {"SBERT": "key\u00e9"}, []]
    got = score.image_inputs(pairs, images, settings)
    ids = sorted(gold_of)
    want = unit_inputs(
        settings, [[datasets.get(i), gold_of[i], [[s, c] for j, s, c, _ in rows if j == i]] for i in ids]
    )
    assert got.column("image_id").to_pylist() == ids
    assert got.column(INPUTS).to_pylist() == want.to_pylist()
