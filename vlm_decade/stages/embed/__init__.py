"""The embed stage: each distinct text (human or model) is encoded once per encoder, into the
`embeddings` table.

Vectors are keyed by the sha256 of the stripped text (`table`), so a description shared by several
rows, or by two runs, costs one encoding. The stage plans its work first (`plan`: the encoders'
checks, and the texts each encoder has no vector for yet). Local encoders run in Ray actors that
load the encoder once; each finished batch is saved as a part, so a killed run keeps what it
finished (`local`). API encoders send their batches through the provider's gateway actor instead,
several at once; it caches every vector, so a text is paid for once across runs (`remote`). In
batch mode every API encoder's texts are submitted as batches before any is waited on
(`models.api.gateways`), so the stage waits one batch turnaround for all its encoders.

The driver never holds a row per text of the whole study: the texts, the vectors already there and
then the vectors to write are spread over 256 buckets on disk by the key's first two hex digits, and
worked through a bucket at a time (a local encoder's texts a chunk of buckets at a time).

The table is a folder of segments (`write`): a run keeps each segment of the last table whose every
row it still wants, and writes one new segment of the rest.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial

from vlm_decade.core.config import StudyBase
from vlm_decade.core.runner import Stage, StudyRun, Written
from vlm_decade.models.api.gateways import Gateways, raise_stops
from vlm_decade.models.api.session import APIStopped
from vlm_decade.models.encoders import encoder_class
from vlm_decade.models.routing import api_provider
from vlm_decade.stages.embed.local import embed_local, local_encoders, start_actors, start_ahead
from vlm_decade.stages.embed.plan import check_encoders, plan_texts
from vlm_decade.stages.embed.remote import embed_remote, queue_embeds, texts_to_send
from vlm_decade.stages.embed.table import EMBEDDINGS_SCHEMA, encoder_key, spill_folder
from vlm_decade.stages.embed.write import write_selected

__all__ = ["EMBEDDINGS_SCHEMA", "check_encoders", "encoder_key", "run_embed", "stage", "start_ahead"]


def run_embed(study: StudyBase, run: StudyRun) -> Written:
    """Encode the texts of the run's references and responses (`plan_texts`) that no encoder has a
    vector for yet, and write the embeddings table."""
    encoders = list(study.encoders)
    local = local_encoders(encoders)
    with spill_folder(run.folder) as spill, ThreadPoolExecutor(1) as planner:
        # The plan is made on a thread while Ray and the first local encoder's actors start (their
        # imports take seconds), if they were not started ahead (`warm`): the vectors and texts to
        # keep are found meanwhile.
        planning = planner.submit(plan_texts, run.folder, encoders, spill)
        started = {local[0].name: run.warmed() or start_actors(study, local[0], run.ray)} if local else {}
        plan = planning.result()
        todo, total = plan.todo, sum(plan.todo.values())
        if total < plan.wanted * len(encoders):
            run.reporter.say(f"     embeddings   {plan.wanted * len(encoders) - total} already encoded, kept")
        remote = {cfg.name: cfg for cfg in encoders if todo[cfg.name] and encoder_class(cfg.backend).remote}
        providers = sorted({api_provider(cfg.backend, cfg.endpoint) for cfg in remote.values()})
        stops: list[APIStopped] = []
        with (
            run.reporter.track("embed", total, todo) as advance,
            Gateways(run, study.providers, providers) as gateways,
        ):
            session = {name: gateways[api_provider(cfg.backend, cfg.endpoint)] for name, cfg in remote.items()}
            work = {
                cfg.name: texts_to_send(plan.todo_tables(i)) for i, cfg in enumerate(encoders) if cfg.name in remote
            }
            # Every batch-mode encoder's texts are handed over and submitted as batches before any is waited on.
            batched = [name for name, cfg in remote.items() if session[name].batch_for(cfg.mode)]
            for name in batched:
                queue_embeds(gateways.ray, session[name], remote[name], *work[name])
            if batched:
                gateways.flush()
            for i, cfg in enumerate(encoders):
                if cfg.name in remote:
                    try:
                        embed_remote(session[cfg.name], cfg, *work.pop(cfg.name), run, partial(advance, part=cfg.name))
                    except APIStopped as exc:  # the other encoders go on; the stage stops after them, naming each
                        stops.append(exc)
                elif todo[cfg.name]:
                    actors = started.pop(cfg.name, [])
                    embed_local(
                        study, cfg, plan.local_batches(i), todo[cfg.name], run, partial(advance, part=cfg.name), actors
                    )
        for actors in started.values():  # started for an encoder that had nothing to encode
            for actor in actors:
                run.ray().kill(actor)
        raise_stops(stops)
        run.cluster_freed()  # the actors are gone: what comes next starts beside the writing
        return write_selected(run.folder, plan, spill / "vectors")


def stage(study: StudyBase) -> Stage:
    """The `embeddings` table: every distinct text of the references and the ok responses, per encoder."""

    def compute(run: StudyRun) -> dict[str, Written]:
        return {"embeddings": run_embed(study, run)}

    return Stage(
        "embeddings",
        ("references", "responses"),
        [e.fingerprint() for e in study.encoders],
        compute,
        warm=(lambda run: start_ahead(study, run.ray)) if local_encoders(study.encoders) else None,
    )
