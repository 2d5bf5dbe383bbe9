"""The batcher: batch mode for one gateway, from a request to its answer.

It groups the requests it is given per kind and model, writes each group to disk and records it
(`records.py`) before it is submitted through the provider's batch interface (`openai_batches.py`,
`gemini_batches.py`) with a fresh label that goes with the batch; then it records the batch's id.
A batcher started later, by a rerun or on another machine that shares the cache folder, finds the
batches still pending and collects them instead of submitting their requests again (a batch whose
submission was cut off before its id was recorded is found by its label among the provider's
batches). Finished batches are downloaded, each line matched to its request by its key, priced at
the batch price, written to the spend log and the cache at once, and handed back as rows; an answer
bought here is handed out as bought (paid, not cached) once, whether its request came before the
batch was collected or after (a rerun's requests arrive while its pollers collect), so the rows of
a run folder sum to its spend log; a line
that failed becomes an error row that a later run retries; the lines an expired batch (or one
cancelled elsewhere) did not reach are submitted again (read back from disk), and nothing else.
`cancel` stops batches on purpose: it keeps what they answered and submits nothing again.

The batcher holds its gateway's budget, and uses only the gateway's public parts: its name,
config, provider, cache, spend log, driver watch, `price`, `error_text` and `failure`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

from vlm_decade.core.config import ProviderConfig
from vlm_decade.models.api.answers import cached_answer, failed_answer, unfinished_answer
from vlm_decade.models.api.batch.gemini_batches import GeminiBatches
from vlm_decade.models.api.batch.lines import BATCH_DISCOUNT, EMBED_LINES, FINISHED, Embedding, Line
from vlm_decade.models.api.batch.openai_batches import OpenAIBatches
from vlm_decade.models.api.batch.records import BatchRecords
from vlm_decade.models.api.cache import vector_entry
from vlm_decade.models.api.providers import ChatRequest, Reply, chat_key, cost, embed_key, text_tokens

LINGER_S = 2.0  # a group is submitted once no request has joined it for this long (or when full)
MAX_POLL_S = 600.0


def batches_for(provider):
    """The batch interface of a provider client."""
    return {"openai": OpenAIBatches, "gemini": GeminiBatches}[provider.name](provider)


class Batcher:
    """Batch mode for one gateway: `submit` a request (an answer at once when the cache has it,
    else it joins a group), `result` waits for its answer; `flush` submits what is grouped.

    With `wait` false, a request whose batch is not finished yet gets a `pending` answer instead of
    a wait: the run can end and a later run collects the batch.
    """

    def __init__(self, gateway, cache_root: str | Path, run_root: str | Path | None, wait: bool = True):
        self.gw = gateway
        self.api = batches_for(gateway.provider)
        self.records = BatchRecords(cache_root, gateway.name, run_root)
        self.wait = wait
        self.resubmit = True  # what a finished batch did not reach is submitted again (not after `cancel`)
        self.budget = gateway.budget
        limits = self.api.LIMITS
        # an endpoint has no batch interface (nor batch fields): its batcher only finds nothing pending
        cfg = gateway.cfg if isinstance(gateway.cfg, ProviderConfig) else ProviderConfig()
        self.max_requests = min(cfg.batch_max_requests or limits.requests, limits.requests)
        self.poll_s = cfg.batch_poll_s
        self.groups: dict[tuple[str, str], list[Line]] = defaultdict(list)  # (kind, model) -> lines not submitted yet
        self.group_bytes: Counter = Counter()
        self.futures: dict[str, asyncio.Future] = {}
        self.bought: dict[str, dict] = {}  # key -> chat answer collected here before any request asked for it
        self.handed: set[str] = set()  # keys whose bought answer a row has: the next gets it at no cost
        self.tries: Counter = Counter()  # submissions per key by this gateway
        self.batch_of: dict[str, str] = {}  # key -> label of the batch it is in
        self.open: dict[str, dict] = {}  # label -> record, for batches not collected yet
        self.pollers: dict[str, asyncio.Task] = {}
        self.collecting = 0  # finished batches being downloaded (their answers are handed out with no wait after)
        self.timer: asyncio.TimerHandle | None = None
        self.stats: Counter = Counter()
        for record in self.records.open_records():  # batches earlier runs left pending
            self.open[record["label"]] = record
            for key in record["keys"]:
                self.batch_of[key] = record["label"]

    # requests ---------------------------------------------------------------------------------
    async def submit(self, req: ChatRequest, hold: bool = False) -> dict:
        """The answer when it is known at once (cache, budget, price), else {"status": "queued"}.
        `hold`: more requests are coming and the caller will `flush`, so no group is submitted
        after a pause, only when it is full."""
        key = chat_key(self.gw.name, req, self.gw.revision)
        if key in self.bought:
            return self._hand_out(key, self.bought.pop(key))
        hit = None if key in self.batch_of else self.gw.cache.get("chat", key)  # in a batch: collected from it
        if hit is not None:
            return cached_answer(hit)

        def line(price) -> Line:
            est_in = self.gw.provider.estimate_input(req)
            cap = req.settings["max_output_tokens"]
            return Line(
                key, req.model_id, BATCH_DISCOUNT * cost(price, est_in, cap), est_in + cap, self.api.payload(key, req)
            )

        return await self._queue(key, req.model_id, line, hold)

    async def submit_embed(self, model_id: str, text: str, hold: bool = False) -> dict:
        """One text to embed: {"status": "ok", "entry"} (its cache entry) when the cache has it, a
        failed answer when it cannot be sent, else {"status": "queued"}; `hold` as for `submit`."""
        key = embed_key(self.gw.name, model_id, text, self.gw.revision)
        hit = None if key in self.batch_of else self.gw.cache.get("embed", key)
        if hit is not None:
            return {"status": "ok", "error": "", "entry": hit, "paid_usd": 0.0}

        def line(price) -> Line:
            tokens = text_tokens(text)
            return Line(
                key,
                model_id,
                BATCH_DISCOUNT * cost(price, tokens, 0),
                tokens,
                self.api.embed_payload(key, model_id, text),
                "embed",
            )

        return await self._queue(key, model_id, line, hold)

    async def embed(self, model_id: str, text: str) -> dict:
        """The answer for one text: from the cache, or from its batch once finished (submitted now
        unless this gateway has it already). The answer is let go once given: a vector is large."""
        key = embed_key(self.gw.name, model_id, text, self.gw.revision)
        if key not in self.futures:
            first = await self.submit_embed(model_id, text)
            if first["status"] != "queued":
                self.futures.pop(key, None)
                return first
        answer = await self.result(key)
        self.futures.pop(key, None)
        return answer

    async def _queue(self, key: str, model_id: str, make_line, hold: bool) -> dict:
        """Add a request to its group, unless it is waiting already (in this gateway's groups, or in
        a batch an earlier run submitted: collected from there, never submitted again)."""
        if key in self.futures and not self.futures[key].done():
            return {"status": "queued", "key": key}
        self.futures[key] = asyncio.get_running_loop().create_future()
        if key in self.batch_of:
            self._poll(self.batch_of[key])
            return {"status": "queued", "key": key}
        try:
            line = make_line(self.gw.price(model_id))
        except LookupError as exc:
            return self._settle(key, failed_answer("error", str(exc)))
        try:
            await self.budget.reserve(line.worst)
        except Exception as exc:  # noqa: BLE001 - a budget stop: the row is skipped
            return self._settle(key, failed_answer(*self.gw.failure(exc)))
        self._group(line, hold)
        return {"status": "queued", "key": key}

    def holds(self, key: str) -> bool:
        """Whether this request's answer comes from a batch (pending, or collected here and not
        handed out yet) rather than from the cache or a new request."""
        return key in self.batch_of or key in self.bought

    async def result(self, key: str) -> dict:
        future = self.futures.get(key)
        if future is None:
            return failed_answer("error", "no such request in this gateway")
        return self._hand_out(key, await asyncio.shield(future))

    async def chat(self, req: ChatRequest) -> dict:
        first = await self.submit(req)
        return first if first["status"] != "queued" else await self.result(first["key"])

    def _hand_out(self, key: str, answer: dict) -> dict:
        """A paid answer as the row of the first request given it; a later one (the same request
        twice) shares it at no cost, as from the cache."""
        if not answer.get("paid_usd") or "entry" in answer:  # vectors: paid once per request by `embed`
            return answer
        if key in self.handed:
            return {**answer, "paid_usd": 0.0, "cached": True}
        self.handed.add(key)
        return answer

    def _settle(self, key: str, answer: dict) -> dict:
        future = self.futures.get(key)
        if future is not None and not future.done():
            future.set_result(answer)
        elif answer.get("paid_usd") and "entry" not in answer:  # a chat answer no request here waits for yet
            self.bought[key] = answer
        return answer

    # grouping and submitting ------------------------------------------------------------------
    def _max_lines(self, kind: str) -> int:
        return min(self.max_requests, EMBED_LINES) if kind == "embed" else self.max_requests

    def _group(self, line: Line, hold: bool) -> None:
        size = len(json.dumps(line.payload))
        name = (line.kind, line.model_id)
        group = self.groups[name]
        if group and (
            len(group) >= self._max_lines(line.kind) or self.group_bytes[name] + size > self.api.max_bytes(line.kind)
        ):
            full, self.groups[name], self.group_bytes[name] = group, [], 0
            asyncio.get_running_loop().create_task(self._submit(name, full))
            group = self.groups[name]
        group.append(line)
        self.group_bytes[name] += size
        if not hold:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = asyncio.get_running_loop().call_later(LINGER_S, lambda: asyncio.ensure_future(self.flush()))

    async def flush(self) -> None:
        """Submit every group that has requests."""
        await asyncio.gather(*[self._submit(name) for name in list(self.groups) if self.groups[name]])

    async def _submit(self, name: tuple[str, str], lines: list[Line] | None = None) -> None:
        """Submit one group of requests of one kind and model as a batch."""
        if lines is None:
            lines, self.groups[name], self.group_bytes[name] = self.groups[name], [], 0
        if not lines:
            return
        kind, model_id = name
        label = f"vlm_decade-{uuid.uuid4().hex}"
        record = {
            "label": label,
            "provider": self.gw.name,
            "kind": kind,
            "model_id": model_id,
            "id": None,
            "state": "creating",
            "created": time.time(),
            "keys": [line.key for line in lines],
        }
        self.records.write_lines(label, lines)
        self.records.save(record)  # before the provider hears of it: a cut-off submission is found by its label
        try:
            record["id"] = await self.api.submit(kind, model_id, lines, label)
        except Exception as exc:  # noqa: BLE001 - the requests are error rows, retried by a later run
            record["state"] = "refused"
            self.records.save(record)
            self.records.drop_lines(label)
            error = self.gw.error_text(exc)
            for line in lines:
                self.budget.release(line.worst, 0.0)
                self._settle(line.key, failed_answer("error", f"batch not accepted: {error}"))
            return
        record["state"] = "submitted"
        self.records.save(record)
        self.stats["batches"] += 1
        self.stats["lines"] += len(lines)
        for line in lines:
            self.tries[line.key] += 1
            self.batch_of[line.key] = label
            if self.gw.log:
                self.gw.log.write(
                    a=f"{record['id']}:{line.key}",
                    e="sent",
                    worst=line.worst,
                    t=round(time.time(), 3),
                    tok=line.tokens,
                    m="batch",
                )
        self.open[label] = record
        self._poll(label, reserved=True)

    async def cancel(self, labels: list[str]) -> dict:
        """Cancel these pending batches (by label) and collect what they answered before the
        provider stopped them: those answers go to the cache and the spend log; the requests they
        did not reach are dropped from the records, submitted again by no one, so the next run sends
        them in the mode its study then says. {"batches", "answered", "dropped", "unknown" (labels
        this gateway's cache folder holds no pending record of)}."""
        self.resubmit = False
        unknown = [
            label for label in labels if label not in self.open
        ]  # not in this cache folder, or collected already
        labels = [label for label in labels if label in self.open]
        before = Counter(self.stats)
        for label in labels:
            record = self.open[label]
            if record["id"] is None:
                record["id"] = await self.api.find(label)
            if record["id"] is None:
                continue
            try:
                await self.api.cancel(record["id"])
            except Exception:  # noqa: BLE001 - finished already, or refused: collected as it stands
                self.stats["cancel_refused"] += 1
        for label in labels:
            self._poll(label)
        await asyncio.gather(*[self.pollers[label] for label in labels])
        return {
            "batches": len(labels),
            "answered": self.stats["answered"] - before["answered"],
            "dropped": self.stats["dropped"] - before["dropped"],
            "unknown": len(unknown),
        }

    # collecting -------------------------------------------------------------------------------
    def _poll(self, label: str, reserved: bool = False) -> None:
        if label not in self.pollers or self.pollers[label].done():
            self.pollers[label] = asyncio.get_running_loop().create_task(self._collect(label, reserved))

    async def _collect(self, label: str, reserved: bool) -> None:
        """Poll one batch with backoff until it is finished, then hand out its answers."""
        record = self.open[label]
        delay = self.poll_s
        try:
            if record["id"] is None:  # cut off between submitting and recording: look for it
                record["id"] = await self.api.find(label)
                if record["id"] is None:
                    return await self._lost(label)
                record["state"] = "submitted"
                self.records.save(record)
            while True:
                status, batch = await self.api.state(record["id"])
                if status in FINISHED:
                    break
                if not self.wait or not self.gw.driver.alive():
                    return self._pending(label, reserved)
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, MAX_POLL_S)
            self.collecting += 1
            try:
                results = await self.api.results(batch, record)
            finally:
                self.collecting -= 1
            why = f"failed ({self.api.failure(batch)})" if status == "failed" else status
        except Exception as exc:  # noqa: BLE001 - this batch's requests wait for a later run
            self.stats["poll_errors"] += 1
            return self._pending(label, reserved, f"could not reach the batch: {self.gw.error_text(exc)}")
        await self._finish(label, status, results, reserved, why)

    def _pending(self, label: str, reserved: bool, why: str = "") -> None:
        """The batch is not finished and this run will not wait: its requests answer `pending`. What
        they may cost stays in the spend log as unresolved (the next gateway counts it); here it
        leaves the reservations for the budget's total, so no request waits on it."""
        record = self.open[label]
        if reserved:
            lines = self.records.lines(label)
            for key in record["keys"]:
                self.budget.hand_over(f"{record['id']}:{key}", lines[key].worst if key in lines else 0.0)
        note = (
            why
            or f"in {self.gw.name} batch {record['id']} (submitted {time.strftime('%Y-%m-%d %H:%M', time.gmtime(record['created']))} UTC)"
        )
        for key in record["keys"]:
            self._settle(key, failed_answer("pending", f"{note}; a later run collects it"))

    async def _lost(self, label: str) -> None:
        """A submission cut off before the provider had it: its requests are submitted again."""
        record = self.open.pop(label)
        record["state"] = "lost"
        self.records.save(record)
        lines = self.records.lines(label)
        self.records.drop_lines(label)
        if self.resubmit:
            await self._again(list(lines.values()))
            return
        self.stats["dropped"] += len(lines)
        for key in lines:
            self._settle(
                key, failed_answer("error", f"{self.gw.name} never received its batch; a later run sends it again")
            )

    async def _finish(self, label: str, status: str, results: dict, reserved: bool, why: str) -> None:
        """Hand out a finished batch's answers. The requests it did not reach are submitted again
        (expired, or cancelled elsewhere), except after `cancel` and when the batch failed as a
        whole (its input would fail again): then they are error rows that a later run sends again."""
        record = self.open.pop(label)
        lines = self.records.lines(label)
        missing = []
        for key in record["keys"]:
            attempt = f"{record['id']}:{key}"
            worst = lines[key].worst if key in lines else 0.0
            answer = results.get(key)
            paid = 0.0
            if isinstance(answer, Embedding):
                tokens = answer.tokens or (
                    lines[key].tokens if key in lines else 0
                )  # Gemini reports none: estimated, as in sync mode
                paid = BATCH_DISCOUNT * cost(self.gw.price(record["model_id"]), tokens, 0)
                entry = vector_entry(answer.vector, answer.model_version, paid, "batch")
                if self.gw.log:
                    self.gw.log.write(a=attempt, e="paid", usd=paid, tok=tokens, m="batch")
                self.gw.cache.put("embed", key, entry)
                row = {"status": "ok", "error": "", "entry": entry, "paid_usd": paid}
            elif isinstance(answer, Reply):
                price = self.gw.price(record["model_id"])
                paid = BATCH_DISCOUNT * cost(price, answer.input_tokens, answer.output_tokens)
                entry = {
                    "text": answer.text,
                    "input_tokens": answer.input_tokens,
                    "output_tokens": answer.output_tokens,
                    "cost_usd": paid,
                    "model_version": answer.model_version,
                    "latency_s": None,
                    "mode": "batch",
                }
                if self.gw.log:
                    self.gw.log.write(
                        a=attempt, e="paid", usd=paid, tok=answer.input_tokens + answer.output_tokens, m="batch"
                    )
                if answer.unfinished:  # bought, but no answer: not cached, so the next run asks again
                    row = unfinished_answer(entry, answer.unfinished, paid, None)
                else:
                    self.gw.cache.put("chat", key, entry)
                    row = {**entry, "status": "ok", "error": "", "queued_s": None, "paid_usd": paid, "cached": False}
            else:
                if self.gw.log:
                    self.gw.log.write(a=attempt, e="failed", m="batch")
                row = failed_answer("error", answer) if isinstance(answer, str) else None
            if reserved:  # this gateway's reservation, or the worst case an earlier gateway left open
                self.budget.release(worst, paid)
            else:
                self.budget.collect(attempt, paid)
            self.batch_of.pop(key, None)
            if row is not None:
                self._settle(key, row)
            elif key in lines:
                missing.append(lines[key])
            else:
                self._settle(
                    key, failed_answer("error", f"{self.gw.name} batch {record['id']} {status} before this request")
                )
        record.update(
            state=status, finished=time.time(), answered=sum(not isinstance(r, str) for r in results.values())
        )
        self.records.save(record)
        self.records.drop_lines(label)
        self.stats[f"batches_{status}"] += 1
        self.stats["answered"] += record["answered"]
        if self.resubmit and status != "failed":
            await self._again(missing)
            return
        self.stats["dropped"] += len(missing)
        for line in missing:
            self._settle(
                line.key,
                failed_answer("error", f"{self.gw.name} batch {record['id']} {why}; a later run sends it again"),
            )

    async def _again(self, lines: list[Line]) -> None:
        """Submit again the requests a batch did not reach (expired, cancelled, lost), up to the
        provider's `max_attempts` submissions each."""
        again = []
        for line in lines:
            if self.tries[line.key] >= self.gw.cfg.max_attempts:
                self._settle(
                    line.key,
                    failed_answer("error", f"not answered in {self.tries[line.key]} batches; a later run tries again"),
                )
                continue
            if line.key not in self.futures:
                self.futures[line.key] = asyncio.get_running_loop().create_future()
            try:
                await self.budget.reserve(line.worst)
            except Exception as exc:  # noqa: BLE001 - a budget stop: skipped
                self._settle(line.key, failed_answer(*self.gw.failure(exc)))
                continue
            again.append(line)
        by_name = defaultdict(list)
        for line in again:
            by_name[(line.kind, line.model_id)].append(line)
        for name, group in by_name.items():
            size = self._max_lines(name[0])
            for i in range(0, len(group), size):
                await self._submit(name, group[i : i + size])
