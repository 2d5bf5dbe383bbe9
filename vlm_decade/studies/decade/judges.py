"""The judge metrics of Study A's descriptions (docs/metrics.md, "Judge metrics"): the prompts, the
reading of the judge's answers, and the metric values they give. Pure; `judging` sends the prompts.

- `rating` (CLAIR, Chan et al. 2023): the judge is shown the description as the candidate set and
  the image's gold standard as the reference set, and rates 0-100 how likely they describe the same
  image, with a reason, in JSON. The metric is the rating / 100 (on the cosines' 0-1 axis).
- `preference` (CapArena, Cheng et al. 2025, its VLM-as-a-judge without reference): the judge sees
  the image and two captions, the description and the gold standard (the top-ranked human's), and
  says which is better or that they tie. It is asked twice, the description first and then second,
  to cancel the position bias; each order gives 1 (the description is better), 0.5 (a tie) or 0,
  and the metric is their mean: 1 when preferred in both orders, 0.5 when split, 0 when in neither.

An answer that cannot be read gives NaN (the metric has no value there), never an exception; the
raw answer stays in the `judge_scores` table.
"""

from __future__ import annotations

import json
import math
import re

# CLAIR's prompt as its authors' code formats it (github.com/davidmchan/clair, clair/clair.py):
# each caption a "- " line, so each set ends in a newline and a blank line follows it.
CLAIR_PROMPT = (
    "You are trying to tell if a candidate set of captions is describing the same image as a reference set of "
    "captions.\n"
    "Candidate set:\n{candidate_statements}\n"
    "Reference set:\n{target_statements}\n"
    "On a precise scale from 0 to 100, how likely is it that the candidate set is "
    'describing the same image as the reference set? (JSON format, with a key "score", '
    'value between 0 and 100, and a key "reason" with a string value.)\n'
)

# CapArena's judge instructions without a reference caption (github.com/njucckevin/CapArena,
# vlm_as_a_judge.py, `system_prompt_without_ref`), sent there as the system message; the gateway
# sends one user message, so they open it, followed by the authors' comparison request.
CAPARENA_INSTRUCTIONS = (
    "You are a highly capable multimodal AI assistant tasked with evaluating image captions.\n"
    "\n"
    "Given an image and two candidate captions, you are require to determine which of the two captions "
    "is better.\n"
    "\n"
    "Below are some guidelines for your reference:\n"
    "\n"
    "1. **Precision**: The caption should accurately correspond to the content of the image, providing "
    "precise information about it. Common examples of imprecision include errors in color, quantity, "
    "spatial relationships, or the posture of people.\n"
    "\n"
    "2. **Informativeness**: Salient information in the image should be reflected in the caption. Since "
    "it is impossible to include every detail, you will need to subjectively judge which aspects of the "
    'image are important. For instance, describing an otter as "a small animal" is precise, but it is '
    'less informative than specifying "an otter".\n'
    "\n"
    "3. **Hallucination**: Captions that include descriptions of objects or elements that are clearly "
    "absent from the image should be significantly penalized.\n"
    "\n"
    "4. **Attention to detail**: Annotators should pay close attention to the details in the image to "
    "distinguish the quality of the descriptions.\n"
    "\n"
    "5. **Assistive description**: Imagine a visually impaired person asking you to describe the image "
    "for them. How would you convey the image to them?\n"
    "\n"
    "6. **Reverse thinking**: What image does the caption lead us to imagine? Does the caption "
    "effectively lead you to imagine the intended image?\n"
    "\n"
    "7. **Ties are acceptable**: If you find it genuinely difficult to determine which caption is better "
    "(e.g., both captions are excellent), marking a tie is acceptable.\n"
    "\n"
    "While the above guidelines provide a framework, they cannot cover all possible cases. Therefore, we "
    "encourage you to make **subjective judgments** based on the specific circumstances and your own "
    "reasoning about which caption is better.\n"
    "\n"
    "### Response Format:\n"
    "Format your response into two lines as shown below:\n"
    "Reason: <your thoughts and reasoning process for the judgment>\n"
    "Judgment: <Caption 1 is better>/<Caption 2 is better>/<Tie>"
)
CAPARENA_COMPARE = (
    "Caption 1:\n{caption_1}\nCaption 2:\n{caption_2}\nDetermine which is better and answer with the given format. "
    "Only mark a tie if there is no discernible difference in quality, informativeness, and precision after "
    "careful evaluation."
)

# The orders a preference is asked in: the description as caption 1, then as caption 2.
ORDERS = ("candidate-first", "gold-first")
# The judge's output cap unless its options set one: CLAIR's JSON and CapArena's reason fit in it.
JUDGE_MAX_OUTPUT_TOKENS = 512


def rating_prompt(candidate: str, references: list[str]) -> str:
    """CLAIR's prompt for one description against its references (the gold standard)."""
    return CLAIR_PROMPT.format(
        candidate_statements=f"- {candidate}\n", target_statements="".join(f"- {r}\n" for r in references)
    )


def preference_prompt(candidate: str, gold: str, order: str) -> str:
    """CapArena's prompt with the description as caption 1 (`candidate-first`) or caption 2."""
    first, second = (candidate, gold) if order == ORDERS[0] else (gold, candidate)
    return CAPARENA_INSTRUCTIONS + "\n\n" + CAPARENA_COMPARE.format(caption_1=first, caption_2=second)


_JSON_OBJECT = re.compile(r"\{.*?\}", re.DOTALL)
_SCORE_FIELD = re.compile(r"\"score\"\s*:\s*\"?([-+]?\d+(?:\.\d+)?)")
_REASON_FIELD = re.compile(r"\"reason\"\s*:\s*\"((?:[^\"\\]|\\.)*)")


def read_rating(answer: str) -> tuple[float, str]:
    """(the rating 0-100, the reason) from a CLAIR answer: the first JSON object with a numeric
    `score` (code fences and text around it allowed), else a `"score": n` field in broken JSON.
    NaN when there is none or it lies outside 0-100 (the reason is kept where found)."""
    score, reason = math.nan, ""
    for match in _JSON_OBJECT.finditer(answer):
        try:
            data = json.loads(match.group(0))
        except json.JSONDecodeError:
            continue
        if (
            isinstance(data, dict)
            and isinstance(data.get("score"), (int, float))
            and not isinstance(data["score"], bool)
        ):
            score, reason = float(data["score"]), str(data.get("reason", ""))
            break
    else:
        field = _SCORE_FIELD.search(answer)
        if field:
            score = float(field.group(1))
        found = _REASON_FIELD.search(answer)
        reason = found.group(1) if found else ""
    return (score if 0.0 <= score <= 100.0 else math.nan), reason


_JUDGMENT = re.compile(r"judg(?:e)?ment\s*:\s*(.+)", re.IGNORECASE)
_REASON = re.compile(r"reason\s*:\s*(.+?)\s*(?:judg(?:e)?ment\s*:|$)", re.IGNORECASE | re.DOTALL)
_VERDICTS = {"caption 1 is better": 1, "caption 2 is better": 2, "tie": 0}


def read_preference(answer: str) -> tuple[int | None, str]:
    """(1, 2 or 0 for a tie; None when unreadable, the reason) from a CapArena answer: its last
    `Judgment:` line, which must be one of the three verdicts (angle brackets, bold and a final
    full stop allowed, as the authors accept "Caption 1 is better." too)."""
    lines = _JUDGMENT.findall(answer)
    reason = _REASON.search(answer)
    said = lines[-1].strip().strip("*<>. ").lower() if lines else ""
    return _VERDICTS.get(said), reason.group(1).strip() if reason else ""


def order_value(verdict: int | None, order: str) -> float:
    """What one order says of the description: 1 preferred, 0.5 a tie, 0 not; NaN unreadable."""
    if verdict is None:
        return math.nan
    if verdict == 0:
        return 0.5
    return 1.0 if verdict == (1 if order == ORDERS[0] else 2) else 0.0
