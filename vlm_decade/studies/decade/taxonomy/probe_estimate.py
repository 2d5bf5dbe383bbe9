"""An upper bound on the error taxonomy's probe questions, for `vlm-decade estimate`.

The questions depend on the descriptions, which do not exist before the run, so they are bounded.
For each API model and image (probes ask about the full image):

- at most one detection and one recognition question per relevant object: the distinct objects of
  the image's gold description, as the taxonomy extracts them (spaCy);
- at most one presence question per object the description mentions; a description is at most
  the model's `max_output_tokens` tokens long and names an object in one token at least, so it
  mentions at most that many.

Every question is sent with the full image (its tokens by the provider's rule), and its words: the
question template with the image's longest gold object names for the object and the anchor; for a
presence question the template, and the mentioned objects, which together are no longer than the
description. Every answer is counted at the model's cap. The low end is no question at all (a
description that names every relevant object and nothing else). The bound is loose by design: the
budget (`providers.<name>.budget_usd`) caps what is really spent.
"""

from __future__ import annotations

from vlm_decade.models.api.providers import cost, provider_class, text_tokens
from vlm_decade.models.backends import backend_class
from vlm_decade.studies.decade.config import StudyConfig
from vlm_decade.studies.decade.data import StudyData
from vlm_decade.studies.decade.taxonomy.objects import ObjectExtractor
from vlm_decade.studies.estimate import Line

FRAMING = 10  # message framing tokens, as the providers' input estimate counts them


def relevant_objects(data: StudyData) -> dict[str, list[str]]:
    """image_id -> the distinct objects of its gold description."""
    gold = {
        r["image_id"]: r["text"]
        for r in data.references.to_pylist()
        if r["role"] == "gold" and r["condition"] == "full"
    }
    ids = sorted(gold)
    found = ObjectExtractor().objects_many([gold[i] for i in ids])
    return {i: list(dict.fromkeys(m.name for m in mentions)) for i, mentions in zip(ids, found)}


def probe_lines(study: StudyConfig, data: StudyData) -> list[Line]:
    """One line per API model: its probe questions, requests and dollars at most."""
    models = [m for m in study.models if backend_class(m.backend).remote]
    if study.taxonomy is None or not models:
        return []
    objects = relevant_objects(data)
    t = study.taxonomy.probes.templates()
    sizes = {r["image_id"]: (r["width"], r["height"]) for r in data.images.to_pylist()}
    lines = []
    for model in models:
        cls = backend_class(model.backend)
        settings = cls.settings(model)
        cap = settings["max_output_tokens"]
        provider = model.endpoint or cls.provider  # the probes go where the model's descriptions went
        price = study.providers.of(provider).price(provider, model.model_id)
        line = Line(provider, f"probes {model.name}", mode=model.mode, model_id=model.model_id)
        for image_id, (width, height) in sorted(sizes.items()):
            relevant = objects.get(image_id, [])
            image = provider_class(cls.provider).image_tokens_of_size(width, height, settings) + FRAMING
            longest = max(map(text_tokens, relevant), default=0)
            detection = (
                max(text_tokens(t.detection), text_tokens(t.detection_no_anchor)) + 2 * longest + 1
            )  # + object, anchor, article
            recognition = max(text_tokens(t.recognition), text_tokens(t.recognition_no_anchor)) + longest
            presence = text_tokens(t.presence) + 1
            questions = 2 * len(relevant) + cap
            line.requests += questions
            line.input_tokens += questions * image + len(relevant) * (detection + recognition) + cap * presence + cap
            line.output_tokens += questions * cap
        line.usd = cost(price, line.input_tokens, line.output_tokens) if price else 0.0
        lines.append(line)
    return lines
