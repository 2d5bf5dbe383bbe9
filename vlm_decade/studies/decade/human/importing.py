"""The data jsPsych saved, turned into the tables Study A reads (docs/human.md, docs/data-format.md).

An experiment's records come as jsPsych writes them: its JSON array (`localSave("json")`, and
`vlm-decade human serve`'s `data/<participant>.json`), its CSV (object fields as JSON text), or a
JATOS export (one JSON array per line, one line a result). Each design trial record becomes a row
of the experiment's table: a description (describe), a vote (rank) or a rating (rate); instruction,
example and attention records are not data. Participants are excluded, each for the first reason
that holds (`Exclusions`): an unfinished session (no `end` record), more failed attention checks
than allowed, distractors chosen above a rate (rank), or a median response time below a floor; and
every participant is listed, kept or not and why (`participants.csv`). Files that cannot be data of
this experiment are refused, naming file and record: another experiment's records, one participant
in two sessions, a trial the design lacks, an image the study lacks.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vlm_decade.core.errors import Problems

DATA_KINDS = frozenset({"describe", "rank", "rate"})
TABLES = {
    "describe": ("descriptions.csv", ("description_id", "image_id", "worker_id", "condition", "text")),
    "rank": ("votes.csv", ("image_id", "rater_id", "trial", "shown", "chosen")),
    "rate": ("ratings.csv", ("rater_id", "subject", "image_id", "rating")),
}
PARTICIPANT_COLUMNS = ("participant", "experiment", "design_participant", "trials", "kept", "reason", "fast_trials")


@dataclass(frozen=True)
class Exclusions:
    """Who is left out (docs/human.md): more than `attention_failures` failed attention checks, a
    rank participant who chose a distractor in more than `distractor_rate` of their trials, a median
    response time of the design trials under `median_rt_ms`, and (`unfinished`) a session with no end.
    Of a kept participant, a trial answered in under `trial_rt_ms` is left out (0: none is)."""

    attention_failures: int = 0
    distractor_rate: float = 0.2
    median_rt_ms: float = 1000.0
    unfinished: bool = True
    trial_rt_ms: float = 0.0


@dataclass(frozen=True)
class Session:
    """One participant's records from one source: a file, or a line of a JATOS export."""

    where: str  # the file, with ", line N" for a JATOS result
    participant: str
    records: list[tuple[str, dict]]  # (the record's place: "record 3" / "row 4", the record)


# --- reading jsPsych's output ----------------------------------------------------------------------


def _csv_value(text: str):
    """A jsPsych CSV cell as jsPsych had it: objects, arrays, numbers and booleans are JSON text."""
    if text == "":
        return None
    if text[0] in "[{" or text in ("true", "false", "null"):
        try:
            return json.loads(text)
        except ValueError:
            return text
    try:
        return int(text) if text.lstrip("-").isdigit() else float(text) if _number(text) else text
    except ValueError:
        return text


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.strip().lower() not in ("nan", "inf", "-inf", "infinity")


def read_sources(path: Path, problems: Problems) -> list[tuple[str, list[tuple[str, dict]]]]:
    """The record lists of one file: (where, [(place, record)]); a bad file or record is a problem."""
    raw = path.read_bytes().decode("utf-8-sig", errors="replace")
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(io.StringIO(raw, newline="")))
        return [
            (str(path), [(f"row {i + 2}", {k: _csv_value(v or "") for k, v in r.items()}) for i, r in enumerate(rows)])
        ]
    try:
        whole = json.loads(raw)
    except ValueError:
        whole = None
    if whole is not None:
        lists = [(str(path), whole)]
    else:  # a JATOS export: one result's JSON array a line
        lists = []
        for number, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                lists.append((f"{path}, line {number}", json.loads(line)))
            except ValueError as exc:
                problems.add(path, f"line {number}: not JSON ({exc.msg})")
    sources = []
    for where, records in lists:
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            problems.add(where, "not a JSON array of jsPsych trial records")
            continue
        sources.append((where, [(f"record {i + 1}", r) for i, r in enumerate(records)]))
    return sources


def sessions(
    sources: Iterable[tuple[str, list[tuple[str, dict]]]], experiment_id: str, problems: Problems
) -> list[Session]:
    """Each participant's records, refusing another experiment's records and a participant twice."""
    found: dict[str, Session] = {}
    for where, records in sources:
        mine: dict[str, list[tuple[str, dict]]] = {}
        for place, record in records:
            if record.get("vd_kind") is None:
                continue  # jsPsych's own records of a plugin that carries no data of ours
            if record.get("vd_experiment") != experiment_id:
                problems.add(
                    where,
                    f"{place}: vd_experiment '{record.get('vd_experiment')}' is another experiment's (this one: '{experiment_id}')",
                    field="vd_experiment",
                )
                continue
            participant = str(record.get("vd_participant") or "")
            if not participant:
                problems.add(where, f"{place}: no vd_participant", field="vd_participant")
                continue
            mine.setdefault(participant, []).append((place, record))
        for participant, listed in mine.items():
            if participant in found:
                first = found[participant]
                problems.add(
                    where,
                    f"{listed[0][0]}: participant '{participant}' twice (a session in {first.where} too)",
                    field="vd_participant",
                )
                continue
            found[participant] = Session(where, participant, listed)
    return [found[p] for p in sorted(found)]


# --- from records to rows --------------------------------------------------------------------------


def _flag(value) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def _options(value) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    return [v.strip() for v in str(value or "").split(";") if v.strip()]


def _trial_row(session: Session, place: str, record: dict, design_row: Mapping[str, str]) -> dict:
    """The table row of one design trial record (the experiment's TABLES columns)."""
    kind, image, who = design_row["kind"], design_row["image_id"], session.participant
    if kind == "describe":
        condition = design_row["condition"]
        ident = f"{image}-{who}" + ("" if condition == "full" else f"-{condition}")
        text = str(record.get("text") or "").strip()
        return {"description_id": ident, "image_id": image, "worker_id": who, "condition": condition, "text": text}
    if kind == "rank":
        shown = _options(record.get("options")) or design_row["options"].split(";")
        chosen = str(record.get("chosen") or "")
        return {
            "image_id": image,
            "rater_id": who,
            "trial": design_row["trial"],
            "shown": ";".join(shown),
            "chosen": chosen,
        }
    return {"rater_id": who, "subject": design_row["subject"], "image_id": image, "rating": record.get("rating")}


def _reason(
    kind: str, finished: bool, failed: int, rows: list[dict], distractors: int, rts: list[float], rules: Exclusions
) -> str:
    """Why a participant is left out, or "" when kept: the first rule of `Exclusions` that holds."""
    if rules.unfinished and not finished:
        return "unfinished: no end record"
    if failed > rules.attention_failures:
        return f"{failed} attention checks failed (more than {rules.attention_failures})"
    if kind == "rank" and rows and distractors / len(rows) > rules.distractor_rate:
        return f"chose a distractor in {distractors} of {len(rows)} trials (more than {rules.distractor_rate:g})"
    if rts and statistics.median(rts) < rules.median_rt_ms:
        return f"median response time {statistics.median(rts):.0f} ms (under {rules.median_rt_ms:g} ms)"
    return ""


def tables(
    found: list[Session],
    design: Mapping[tuple[str, int], Mapping[str, str]],
    images: set[str],
    rules: Exclusions,
    problems: Problems,
) -> tuple[str, list[dict], list[dict]]:
    """The experiment's kind, its table's rows (kept participants only) and the participants table.
    `design`: (design participant, trial) -> the design row."""
    kind = next(iter(design.values()))["experiment"]
    rows, people = [], []
    for session in found:
        mine, failed, distractors, rts, finished, given, seen = [], 0, 0, [], False, "", set()
        for place, record in session.records:
            vd_kind = record.get("vd_kind")
            finished |= vd_kind == "end"
            if vd_kind not in DATA_KINDS | {"attention"}:
                continue
            given = str(record.get("vd_design_participant") or "")
            try:
                key = (given, int(record.get("vd_trial")))
            except (TypeError, ValueError):
                key = (given, -1)
            row = design.get(key)
            if row is None or row["kind"] != vd_kind:
                problems.add(
                    session.where,
                    f"{place}: the design has no {vd_kind} trial {key[1]} for '{given}'",
                    field="vd_trial",
                )
                continue
            if key in seen:
                problems.add(session.where, f"{place}: trial {key[1]} of '{given}' twice", field="vd_trial")
                continue
            seen.add(key)
            if str(record.get("image_id", row["image_id"])) not in images:
                problems.add(
                    session.where,
                    f"{place}: image_id '{record.get('image_id')}' is not in the study's images",
                    field="image_id",
                )
                continue
            if vd_kind == "attention":
                failed += not _flag(record.get("attention_passed"))
                continue
            mine.append(_trial_row(session, place, record, row))
            distractors += kind == "rank" and mine[-1]["chosen"] in row["distractors"].split(";")
            rt = record.get("rt")
            rts.append(float(rt) if isinstance(rt, (int, float)) and not isinstance(rt, bool) else None)
        timed = [rt for rt in rts if rt is not None]
        reason = _reason(kind, finished, failed, mine, distractors, timed, rules)
        fast = [rt is not None and rt < rules.trial_rt_ms for rt in rts]
        people.append(
            {
                "participant": session.participant,
                "experiment": kind,
                "design_participant": given,
                "trials": len(mine),
                "kept": "yes" if not reason else "no",
                "reason": reason,
                "fast_trials": sum(fast),
            }
        )
        if not reason:
            rows += [row for row, quick in zip(mine, fast) if not quick]
    return kind, rows, people


# --- the experiment folder and the study -----------------------------------------------------------


def read_design(folder: Path, problems: Problems) -> tuple[str, dict[tuple[str, int], dict]]:
    """The experiment's id and its design rows by (participant, trial), from its folder."""
    from vlm_decade.core.tables import read_table
    from vlm_decade.studies.decade.human.design import DESIGN_COLUMNS

    meta_path = folder / "experiment.json"
    try:
        ident = json.loads(meta_path.read_text(encoding="utf-8"))["experiment_id"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problems.add(meta_path, f"not an experiment folder's experiment.json ({exc})")
        return "", {}
    table = read_table(folder / "design.csv", DESIGN_COLUMNS, problems)
    if table is None:
        return ident, {}
    design = {}
    for row in table.columns.to_pylist():
        design[(row["participant"], int(row["trial"]))] = row
    return ident, design


def data_files(paths: Iterable[Path]) -> list[Path]:
    """The files named, a folder standing for its .json, .csv and .txt files (as `data/` holds them)."""
    files = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix.lower() in (".json", ".csv", ".txt") and p.is_file())
        else:
            files.append(path)
    return files


def _check_written(
    study, kind: str, path: Path, images: set[str], scale: tuple[float, float], problems: Problems
) -> None:
    """The written table, checked by the loaders the study's run uses; `images`: the study's image ids."""
    from vlm_decade.core.errors import InputError
    from vlm_decade.studies.decade.data import load_study_data
    from vlm_decade.studies.decade.metric_validation import check_ratings

    if kind == "rate":
        check_ratings(path, [m.name for m in study.models], images, problems, scale)
        return
    swap = {"descriptions": path, "votes": None} if kind == "describe" else {"votes": path}
    try:
        load_study_data(study.data.model_copy(update=swap), study.ranking, study.masks)
    except InputError as exc:
        problems.extend(exc.problems)


def study_image_ids(study) -> set[str]:
    from vlm_decade.studies.decade.human.design import study_images

    return set(study_images(study)[0])


def import_experiment(study, folder: Path, paths: list[Path], rules: Exclusions, out: Path) -> dict[str, Path]:
    """Read the records, write the experiment's table and participants.csv into `out` once the
    study's loaders accept them (nothing is written otherwise); returns what was written."""
    from vlm_decade.core.errors import InputError, Problem
    from vlm_decade.core.files import atomic_write_bytes
    from vlm_decade.studies.decade.human.design import csv_bytes

    problems = Problems()
    ident, design = read_design(folder, problems)
    problems.raise_if_any()
    scale = json.loads((folder / "experiment.json").read_text(encoding="utf-8"))["scale"]
    sources = [s for path in data_files(paths) for s in read_sources(path, problems)]
    found = sessions(sources, ident, problems)
    if not found and not problems:
        problems.add(", ".join(map(str, paths)) or str(folder), "no records of this experiment")
    problems.raise_if_any()
    images = study_image_ids(study)  # every image checked once, as a run checks it
    kind, rows, people = tables(found, design, images, rules, problems)
    problems.raise_if_any()
    name, columns = TABLES[kind]
    staged = {out / name: csv_bytes(columns, rows), out / "participants.csv": csv_bytes(PARTICIPANT_COLUMNS, people)}
    checked = out / ".checking" / name  # the same name, so the loaders' messages name the table
    atomic_write_bytes(checked, staged[out / name])
    try:
        _check_written(study, kind, checked, images, (scale["min"], scale["max"]), problems)
    finally:
        checked.unlink(missing_ok=True)
        checked.parent.rmdir()
    if problems:  # named by the table's own path, not the file it was checked as
        named = [
            Problem(p.file.replace(str(checked), str(out / name)), p.message, p.row, p.field) for p in problems.items
        ]
        raise InputError(named)
    for path, data in staged.items():
        atomic_write_bytes(path, data)
    return {kind: out / name, "participants": out / "participants.csv"}
