"""The paper's three human experiments as design tables: who sees what, in which order.

Study A's people's side (METHOD.md, "Human data") came from three experiments: free descriptions of
each image (and of its masked versions), a ranking in which each worker picks the best of a few of
an image's descriptions shown beside distractors from other images, and ratings of how similar a
model's description is to the gold standard. Each design here is a pure function of its counts and a
seed; every random choice is drawn from a named stream of that seed (`named_generator(seed,
"human:<experiment>:...")`), so the same inputs give the same table on any machine. A design is a
list of trial rows (the columns of `DESIGN_COLUMNS`, docs/human.md) and `write_experiment` writes it,
with the texts and images it shows and its parameters, as the experiment folder.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from PIL import Image

from vlm_decade.core import storage
from vlm_decade.core.errors import STUDY_FILE, InputError, Problem, Problems
from vlm_decade.core.files import atomic_write_bytes
from vlm_decade.imaging.decode import load_rgb
from vlm_decade.stats.resampling import named_generator

DESIGN_COLUMNS = (
    "experiment",
    "participant",
    "trial",
    "kind",
    "image_id",
    "image",
    "condition",
    "options",
    "distractors",
    "subject",
    "text",
    "gold",
    "answer",
)
EXPERIMENTS = ("describe", "rank", "rate")
SCALE = {"min": 1, "max": 5, "step": 1, "labels": ["not similar at all", "", "", "", "the same meaning"]}
ATTENTION_WORD = "lantern"  # the word a describe attention check asks to be typed


@dataclass(frozen=True)
class Design:
    """A design table (rows in `DESIGN_COLUMNS`), the texts its rank trials show and its counts."""

    experiment: str
    rows: list[dict]
    texts: dict[str, str]  # description id -> text, for rank trials' options
    parameters: dict


def participant_ids(n: int) -> list[str]:
    """p001, p002, ... (wider when there are more than 999)."""
    width = max(3, len(str(n)))
    return [f"p{i + 1:0{width}d}" for i in range(n)]


def _row(experiment: str, participant: str, kind: str, image_id: str, **cells) -> dict:
    row = dict.fromkeys(DESIGN_COLUMNS, "")
    row.update(experiment=experiment, participant=participant, kind=kind, image_id=image_id, condition="full")
    row.update(cells)
    return row


def _ordered(rows: list[dict], rng: np.random.Generator) -> list[dict]:
    """The trials in a random order, numbered from 1."""
    shuffled = [rows[i] for i in rng.permutation(len(rows))]
    for number, row in enumerate(shuffled, 1):
        row["trial"] = number
    return shuffled


def _attention(rows: list[dict], rate: float, make, rng: np.random.Generator) -> list[dict]:
    """`rows` and round(rate x len(rows)) attention trials, each on an image the participant sees."""
    count = int(round(rate * len(rows)))
    return rows + [make(rows[int(rng.integers(len(rows)))], k) for k in range(count)]


def describe_design(
    images: Sequence[str],
    *,
    per_image: int = 20,
    per_participant: int = 50,
    conditions: Sequence[str] = ("full",),
    attention_rate: float = 0.0,
    seed: int = 0,
) -> Design:
    """Free descriptions: every (image, condition) described by `per_image` different participants.

    Replicate r of `per_image` gives each of len(conditions) groups every image once, group g seeing
    the image at place i of a shuffled order in condition (i + g) mod len(conditions): so each
    (image, condition) is seen once per replicate and no participant sees an image twice (in two
    conditions least of all). Each group's images are cut into participants of `per_participant`.
    """
    if per_image < 1 or per_participant < 1 or not conditions or not images:
        raise ValueError("describe: per_image, per_participant, conditions and images must be positive")
    rng = named_generator(seed, "human:describe:assign")
    k = len(conditions)
    sessions: list[list[tuple[str, str]]] = []
    for _ in range(per_image):
        order = [images[i] for i in rng.permutation(len(images))]
        for g in range(k):
            seen = [(image, conditions[(i + g) % k]) for i, image in enumerate(order)]
            sessions += [seen[a : a + per_participant] for a in range(0, len(seen), per_participant)]
    ids = participant_ids(len(sessions))
    rows = []
    for pid, session in zip(ids, sessions):
        stream = named_generator(seed, f"human:describe:{pid}")
        trials = [_row("describe", pid, "describe", image, condition=condition) for image, condition in session]

        def check(like: dict, k: int, pid=pid) -> dict:
            prompt = f"Attention check: describe the image and include the word '{ATTENTION_WORD}'."
            # in the condition the participant sees the image in: never one image in two conditions
            cells = {"condition": like["condition"], "text": prompt, "answer": ATTENTION_WORD}
            return _row("describe", pid, "attention", like["image_id"], **cells)

        rows += _ordered(_attention(trials, attention_rate, check, stream), stream)
    parameters = {
        "per_image": per_image,
        "per_participant": per_participant,
        "conditions": list(conditions),
        "participants": len(ids),
        "attention_rate": attention_rate,
    }
    return Design("describe", rows, {}, parameters)


def _shown_per_participant(ids: list[str], n_shown: int, participant: int) -> list[str]:
    """Which of an image's descriptions participant p sees: all of them, or a window of `n_shown`
    moving round a fixed order by `n_shown` a participant, so each is shown equally often to within one."""
    if n_shown >= len(ids):
        return list(ids)
    start = participant * n_shown
    return [ids[(start + j) % len(ids)] for j in range(n_shown)]


def _split(ids: list[str], groups: int, rng: np.random.Generator, taken: set) -> list[list[str]]:
    """A random split of `ids` into `groups` groups (sizes within one), redrawn while it is in
    `taken`: distinct from every participant's before, as long as distinct splits are easy to find
    (six descriptions in two groups have only ten: beyond that, splits repeat)."""
    for _ in range(100):
        parts = [sorted(p) for p in np.array_split(np.asarray(ids, dtype=object)[rng.permutation(len(ids))], groups)]
        key = frozenset(tuple(p) for p in parts)
        if key not in taken:
            break
    taken.add(key)
    return [[str(i) for i in p] for p in parts]


class _Distractors:
    """A participant's distractors: a shuffled queue of a dataset's descriptions, each dealt once."""

    def __init__(self, pool: list[tuple[str, str]], rng: np.random.Generator):
        self.queue = deque(pool[i] for i in rng.permutation(len(pool)))

    def deal(self, image_id: str, count: int) -> list[str] | None:
        skipped, dealt = [], []
        while self.queue and len(dealt) < count:
            image, description = self.queue.popleft()
            (skipped if image == image_id else dealt).append((image, description))
        self.queue.extendleft(reversed(skipped))
        if len(dealt) < count:
            return None
        return [d for _, d in dealt]


def rank_design(
    descriptions: Mapping[str, Sequence[str]],
    datasets: Mapping[str, str],
    texts: Mapping[str, str],
    *,
    shown: int = 5,
    distractors: int = 2,
    splits: int | None = None,
    participants: int = 50,
    attention_rate: float = 0.0,
    seed: int = 0,
) -> Design:
    """Ranking: per participant and image, a distinct random split of the image's descriptions into
    `splits` groups of `shown` (default: all of them, the paper's 20 = 4 x 5), each group one trial
    beside `distractors` descriptions of other images of the same dataset, never repeated within a
    participant; options and trial order shuffled per participant.

    `descriptions`: image id -> its `full` description ids; `datasets`: image id -> dataset.
    """
    images = sorted(descriptions)
    sizes = {i: len(descriptions[i]) for i in images}
    groups = splits or max(-(-n // shown) for n in sizes.values())
    if shown < 1 or distractors < 0 or participants < 1 or groups < 1:
        raise ValueError("rank: shown, splits and participants must be positive, distractors not negative")
    for image in images:
        if groups * shown > sizes[image] and splits is not None:
            raise ValueError(f"rank: image {image!r} has {sizes[image]} descriptions, fewer than {groups} x {shown}")
    fixed = {i: sorted(descriptions[i]) for i in images}
    for image in images:  # the order a window of shown descriptions moves round
        order = named_generator(seed, f"human:rank:order:{image}").permutation(len(fixed[image]))
        fixed[image] = [fixed[image][j] for j in order]
    pools: dict[str, list[tuple[str, str]]] = {}
    for image in images:
        pools.setdefault(datasets[image], []).extend((image, d) for d in sorted(descriptions[image]))
    taken: dict[str, set] = {i: set() for i in images}
    rows, used = [], {}
    for p, pid in enumerate(participant_ids(participants)):
        rng = named_generator(seed, f"human:rank:{pid}")
        deal = {name: _Distractors(pool, rng) for name, pool in sorted(pools.items())}
        trials = []
        for image in images:
            ids = _shown_per_participant(fixed[image], min(groups * shown, sizes[image]), p)
            for group in _split(ids, min(groups, len(ids)), rng, taken[image]):
                others = deal[datasets[image]].deal(image, distractors)
                if others is None:
                    raise ValueError(
                        f"rank: dataset {datasets[image]!r} has too few descriptions of other images for "
                        f"{distractors} distractors a trial, never repeated within a participant"
                    )
                options = group + others
                options = [options[i] for i in rng.permutation(len(options))]
                used.update((d, texts[d]) for d in options)
                trials.append(_row("rank", pid, "rank", image, options=";".join(options), distractors=";".join(others)))

        def check(like: dict, k: int, pid=pid, rng=rng) -> dict:
            key = f"attention-{pid}-{k + 1}"
            used[key] = "Attention check: choose this sentence, whatever the image shows."
            options = like["options"].split(";")[: shown + distractors - 1] + [key]
            options = [options[i] for i in rng.permutation(len(options))]
            return _row("rank", pid, "attention", like["image_id"], options=";".join(options), answer=key)

        rows += _ordered(_attention(trials, attention_rate, check, rng), rng)
    parameters = {
        "shown": shown,
        "distractors": distractors,
        "splits": groups,
        "participants": participants,
        "images": len(images),
        "attention_rate": attention_rate,
    }
    return Design("rank", rows, dict(sorted(used.items())), parameters)


def rate_design(
    pairs: Sequence[Mapping[str, str]],
    *,
    raters: int = 16,
    per_rater: int | None = None,
    attention_rate: float = 0.0,
    seed: int = 0,
) -> Design:
    """Rating: each of `raters` rates `per_rater` (default: all) (subject, image) pairs, the model's
    text beside the gold standard's; with fewer than all, a window moving round a fixed shuffled
    order, so each pair is rated equally often to within one. `pairs`: subject, image_id, text, gold."""
    if raters < 1 or not pairs:
        raise ValueError("rate: raters and pairs must be positive")
    count = len(pairs) if per_rater is None else min(per_rater, len(pairs))
    key = sorted(range(len(pairs)), key=lambda i: (pairs[i]["subject"], pairs[i]["image_id"]))
    fixed = [key[i] for i in named_generator(seed, "human:rate:order").permutation(len(key))]
    rows = []
    for r, pid in enumerate(participant_ids(raters)):
        rng = named_generator(seed, f"human:rate:{pid}")
        window = [fixed[(r * count + j) % len(fixed)] for j in range(count)]
        trials = [
            _row("rate", pid, "rate", pairs[i]["image_id"], subject=pairs[i]["subject"], text=pairs[i]["text"])
            | {"gold": pairs[i]["gold"]}
            for i in window
        ]

        def check(like: dict, k: int, pid=pid) -> dict:
            text = f"Attention check: whatever the gold standard says, rate this one {SCALE['max']}."
            return _row("rate", pid, "attention", like["image_id"], text=text, gold=like["gold"], answer=SCALE["max"])

        rows += _ordered(_attention(trials, attention_rate, check, rng), rng)
    parameters = {"raters": raters, "per_rater": count, "pairs": len(pairs), "attention_rate": attention_rate}
    return Design("rate", rows, {}, parameters)


def csv_bytes(columns: Sequence[str], rows: list[dict]) -> bytes:
    """`rows` as CSV text: every cell as text, quoted as the study's tables are read (docs/data-format.md)."""
    table = pa.table({c: pa.array([str(r[c]) for r in rows], pa.string()) for c in columns})
    sink = pa.BufferOutputStream()
    pacsv.write_csv(table, sink, pacsv.WriteOptions(quoting_style="needed"))
    return sink.getvalue().to_pybytes()


# The formats every browser shows; an image in another (TIFF, PPM, ...) is shown as the models see it.
BROWSER_FORMATS = {"JPEG": ".jpg", "PNG": ".png", "GIF": ".gif", "WEBP": ".webp"}


def _browser_image(location: str) -> tuple[str, bytes]:
    """(extension, bytes) of the image at `location`, in a format a browser shows."""
    data = storage.read_bytes(location)
    with Image.open(io.BytesIO(data)) as im:
        kind = im.format
    if kind in BROWSER_FORMATS:
        return BROWSER_FORMATS[kind], data
    buffer = io.BytesIO()
    Image.fromarray(load_rgb(location)[0]).save(buffer, format="PNG")
    return ".png", buffer.getvalue()


def experiment_id(design_csv: bytes) -> str:
    """The experiment's id: the first 16 hex digits of its design table's SHA-256."""
    return hashlib.sha256(design_csv).hexdigest()[:16]


def write_experiment(design: Design, images: Mapping[str, str], out: Path, seed: int) -> dict:
    """Write the experiment folder: design.csv, texts.csv, images/ (each image used, once, as
    `<image_id><ext>`, a browser's format kept as it is, any other written as PNG) and
    experiment.json; returns what experiment.json holds. `images`: id -> location."""
    used = sorted({r["image_id"] for r in design.rows})
    missing = [i for i in used if i not in images]
    if missing:
        raise InputError([Problem(str(out), f"no image file for image_id {missing[0]!r}", field="image_id")])
    names = {}
    for image in used:
        suffix, data = _browser_image(images[image])
        names[image] = f"{image}{suffix}"
        atomic_write_bytes(out / "images" / names[image], data)
    for row in design.rows:
        row["image"] = names[row["image_id"]]
    table = csv_bytes(DESIGN_COLUMNS, design.rows)
    atomic_write_bytes(out / "design.csv", table)
    texts = [{"description_id": k, "text": v} for k, v in design.texts.items()]
    atomic_write_bytes(out / "texts.csv", csv_bytes(("description_id", "text"), texts))
    ident = experiment_id(table)
    meta = {
        "experiment": design.experiment,
        "experiment_id": ident,
        "seed": seed,
        "parameters": design.parameters,
        "counts": {
            "participants": len({r["participant"] for r in design.rows}),
            "trials": len(design.rows),
            "images": len(used),
            "attention": sum(r["kind"] == "attention" for r in design.rows),
        },
        "scale": SCALE,
        "completion_code": "VD-" + hashlib.sha256(f"{ident}:{seed}".encode()).hexdigest()[:8].upper(),
    }
    atomic_write_bytes(out / "experiment.json", (json.dumps(meta, indent=2) + "\n").encode())
    return meta


# --- from a study ----------------------------------------------------------------------------------


def study_images(study) -> tuple[dict[str, str], dict[str, str]]:
    """The study's images, in whichever form it keeps them (an images table and folder, a captions
    JSON, shards), checked as a run checks them: id -> dataset, id -> location (a file, an object or
    a shard's member: what `storage.read_bytes` reads)."""
    from vlm_decade.stages.images import check_images
    from vlm_decade.stages.shard_images import study_shard_images
    from vlm_decade.studies.decade.data import read_forms

    data, problems = study.data, Problems()
    table, _ = read_forms(data, problems)
    if data.shards is not None:
        images = (study_shard_images(data, table, problems, None, None) or (None, None))[1]
    else:
        images = None if table is None else check_images(table, data.image_dir, problems, None, data.background)
    problems.raise_if_any()
    ids, datasets, paths = (images.column(c).to_pylist() for c in ("image_id", "dataset", "path"))
    return dict(zip(ids, datasets)), dict(zip(ids, paths))


def _study_descriptions(study, known: Mapping[str, str]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The study's `full` descriptions: image id -> ids, id -> text."""
    from vlm_decade.core.tables import read_table
    from vlm_decade.studies.decade.data import DESCRIPTION_COLUMNS, read_forms

    problems = Problems()
    if study.data.captions_json is not None:  # its captions are the descriptions
        table = read_forms(study.data, problems)[1]
    elif study.data.descriptions is None:
        raise InputError(
            [Problem(STUDY_FILE, "a ranking design needs the study's descriptions table", field="data.descriptions")]
        )
    else:
        table = read_table(Path(study.data.descriptions), DESCRIPTION_COLUMNS, problems)
    problems.raise_if_any()
    by_image, texts = {}, {}
    for row in table.rows:
        cells = {c: v.strip() for c, v in row.cells.items()}
        if cells["image_id"] not in known:
            problems.add(table.file, f"unknown image_id '{cells['image_id']}'", row=row.number, field="image_id")
        elif cells["condition"] == "full":
            by_image.setdefault(cells["image_id"], []).append(cells["description_id"])
            texts[cells["description_id"]] = cells["text"]
    problems.raise_if_any()
    return by_image, texts


def run_pairs(run_folder: Path) -> list[dict]:
    """A finished run's (subject, image_id, text, gold) for every model's full-image description."""
    from vlm_decade.core.runfolder import RunFolder
    from vlm_decade.studies.decade.score import scoring_pairs

    folder = RunFolder(run_folder)
    if not (folder.has("references") and folder.has("responses")):
        raise InputError([Problem(str(run_folder), "not a finished Study A run folder (no references/responses)")])
    pairs = scoring_pairs(folder.read("references"), folder.read("responses")).to_pylist()
    return [
        {"subject": p["subject"], "image_id": p["image_id"], "text": p["candidate"], "gold": p["gold"]}
        for p in pairs
        if not p["subject"].startswith("human:")
    ]


def study_design(study, experiment: str, counts: Mapping[str, object], seed: int, run_folder: Path | None) -> Design:
    """The `experiment` design for a loaded Study A config; `counts`: the design function's counts."""
    from vlm_decade.imaging.masks import mask_ids

    datasets, _ = study_images(study)
    if experiment == "describe":
        conditions = ["full", *mask_ids(study.masks)] if counts.get("masks") else ["full"]
        rest = {k: v for k, v in counts.items() if k != "masks"}
        return describe_design(sorted(datasets), conditions=conditions, seed=seed, **rest)
    if experiment == "rank":
        by_image, texts = _study_descriptions(study, datasets)
        return rank_design(by_image, datasets, texts, seed=seed, **counts)
    pairs = [p for p in run_pairs(run_folder or Path(study.output)) if p["image_id"] in datasets]
    return rate_design(pairs, seed=seed, **counts)
