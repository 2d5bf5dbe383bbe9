"""API models (`remote` backends) do not sit in an actor pool: Ray tasks encode their stimuli as PNG
bytes and send the requests to the provider's gateway actor (`vlm_decade.models.api`) with many in
flight; finished rows are saved as parts every few seconds, and every answer that reaches the
gateway is in the API cache at once, so a killed run buys again at most the requests that were in
flight when it died.

In batch mode (a model's own `mode`, else its provider's) the requests are first only submitted:
every batch-mode model of the stage hands its requests to its gateway, the gateways submit them as
batches, and only then is any answer waited on (`models.api.gateways`). A run that does not wait stops
after that with the rows it has (every batch of the stage submitted), and a later run collects the
rest.
"""

from __future__ import annotations

from collections import defaultdict

from vlm_decade.core.config import ModelConfig, StudyBase
from vlm_decade.core.dispatch import batches, bounded, original
from vlm_decade.core.runner import StudyRun
from vlm_decade.models.api.answers import failed_answer, gateway_call_failed
from vlm_decade.models.api.gateways import Gateways, raise_stops
from vlm_decade.models.api.session import BatchesPending, stop_if_pending
from vlm_decade.models.backends import backend_class
from vlm_decade.models.routing import api_provider
from vlm_decade.stages.describe.plan import Job, load_png
from vlm_decade.stages.describe.rows import RESPONSES_SCHEMA, AnswerCountError, failed_batch, one_for_one, response_row

REMOTE_BATCH = 8  # stimuli one Ray task encodes and sends for an API model
FLUSH_ROWS, FLUSH_S = 32, 2.0  # save API rows as a part this often


def ask_gateway(gateway, model_id: str, settings: dict, jobs: list[Job], batch: bool = False) -> list[dict]:
    """A Ray task: each job's stimulus as PNG, with its prompt, through the provider's gateway
    actor; one answer per job, in order. Image bytes go from here to the gateway, never through the
    driver. In batch mode the requests are only submitted: an answer not known at once is
    {"status": "queued", "key"}, for `finish_queued`."""
    import ray

    from vlm_decade.models.api.providers import ChatRequest

    def send(req: ChatRequest):
        return (
            gateway.submit.remote(req, True) if batch else gateway.chat.remote(req, False)
        )  # batch: held until the caller flushes

    refs = [
        png if isinstance(png, str) else send(ChatRequest(model_id, job.prompt, png, settings))
        for job, png in zip(jobs, load_png(jobs))
    ]
    answers = []
    for ref in refs:
        if isinstance(ref, str):
            answers.append(failed_answer("error", ref))
            continue
        try:
            answers.append(ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - a lost call is an error row, tried again next run
            answers.append(failed_answer("error", gateway_call_failed(original(exc))))
    return answers


def finish_queued(ray, gateway, answers: list[dict]) -> list[dict]:
    """Batch mode: the answers of the queued requests, once their batches are done (or `pending`,
    when the run does not wait)."""
    queued = [i for i, a in enumerate(answers) if a["status"] == "queued"]
    if queued:
        ray.get(gateway.flush.remote())
        for i, answer in zip(queued, ray.get([gateway.result.remote(answers[i]["key"]) for i in queued])):
            answers[i] = answer
    return answers


class RemoteModels:
    """The API models of one describe stage, over one gateway per provider: `send` hands a model's
    jobs to its gateway (in batch mode their answers then wait), `submit` has the gateways submit
    what waits as batches, `collect` waits for every answer still waiting, and `stop` says what is
    left (budget skips as a warning; batches still pending as `BatchesPending`)."""

    def __init__(self, study: StudyBase, run: StudyRun, models: list[ModelConfig], advance):
        self.study, self.run, self.advance = study, run, advance
        self.gateways = Gateways(run, study.providers, sorted({api_provider(m.backend, m.endpoint) for m in models}))
        self.parts = run.folder.parts("responses", RESPONSES_SCHEMA, FLUSH_ROWS, FLUSH_S, on_save=self.gateways.record)
        self.waiting: list[tuple[Job, str, str]] = []  # (job, provider, request key) of answers that wait in batches
        self.answers: dict[str, list[dict]] = defaultdict(list)  # model -> the answers it was given

    def in_batches(self, model: ModelConfig) -> bool:
        return self.gateways[api_provider(model.backend, model.endpoint)].batch_for(model.mode)

    def send(self, model: ModelConfig, jobs: list[Job]) -> None:
        """Every job of `model` through its gateway, a few Ray tasks at a time; the answers known at
        once are saved as rows, the others wait for `collect`."""
        cls = backend_class(model.backend)
        provider = api_provider(model.backend, model.endpoint)
        session, ray = self.gateways[provider], self.gateways.ray
        settings, batch = cls.settings(model), session.batch_for(model.mode)
        tasks = max(1, 2 * self.study.providers.of(provider).max_concurrency // REMOTE_BATCH)
        ask = ray.remote(ask_gateway).options(num_cpus=0)
        submit = lambda jobs, _: ask.remote(session.actor, model.model_id, settings, jobs, batch)  # noqa: E731
        for done in bounded(ray, batches(jobs, REMOTE_BATCH), submit, tasks):
            error = done.error
            if error is None:
                try:
                    answers = one_for_one(done.work, done.value, f"the {provider} gateway")
                except AnswerCountError as exc:
                    error = exc
            if error is not None:  # the batch's rows are errors, tried again next run
                self.parts.add(failed_batch(done.work, error))
                self.advance(len(done.work), model.name)
                continue
            self.waiting += [(j, provider, a["key"]) for j, a in zip(done.work, answers) if a["status"] == "queued"]
            ready = [(j, a) for j, a in zip(done.work, answers) if a["status"] != "queued"]
            self.answers[model.name] += [a for _, a in ready]
            self.parts.add([response_row(j, a) for j, a in ready])
            self.advance(len(ready), model.name)

    def submit(self) -> None:
        """Every request that waits goes to its provider in a batch now; the rows known so far are saved."""
        if self.waiting:
            self.gateways.flush()
        self.parts.save()

    def collect(self) -> None:
        """The answers of every request that waits, as their batches finish (`pending`, when the run
        does not wait)."""
        self.submit()
        result = lambda item, _: self.gateways[item[1]].actor.result.remote(item[2])  # noqa: E731
        for done in bounded(self.gateways.ray, self.waiting, result, max(1, len(self.waiting))):
            lost = done.error is not None
            answer = failed_answer("error", gateway_call_failed(done.error)) if lost else done.value
            job = done.work[0]
            self.answers[job.subject].append(answer)
            self.parts.add([response_row(job, answer)])
            self.advance(1, job.subject)
        self.waiting = []

    def stop(self) -> None:
        """Say which models' requests a budget skipped (the stage ends `incomplete`: the stages after
        it run on the rows that exist, and the next run sends the rest); raise `BatchesPending`
        naming each model whose answers still wait in batches."""
        stops = []
        for name, answers in self.answers.items():
            skipped = [a["error"] for a in answers if a["status"] == "skipped"]
            if skipped:
                self.run.reporter.say(
                    f"     [yellow]{name}: {len(skipped)} requests not sent[/yellow]: {skipped[0]}; the "
                    "stages after this one use the answers that exist, and the next run sends the rest"
                )
            try:
                stop_if_pending(answers, f"responses of {name}")
            except BatchesPending as exc:
                stops.append(exc)
        raise_stops(stops)

    def __enter__(self) -> RemoteModels:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.parts.__exit__(*exc)
        finally:
            self.gateways.__exit__(*exc)
