"""Two runs sharing one API cache folder at once leave only whole files: each answer file is one of
the two runs' answers, entire, and no temporary file is left behind."""

import json
import multiprocessing

from vlm_decade.models.api.cache import ResponseCache

KEYS = [f"{i:064x}" for i in range(300)]


def _writer(root: str, who: str, start) -> None:
    start.wait()
    cache = ResponseCache(root)
    for key in KEYS:
        cache.put("chat", key, {"text": f"answer of {who} " + "x" * 2000, "who": who})


def test_two_runs_writing_the_same_answers_at_once_leave_whole_files(tmp_path):
    context = multiprocessing.get_context("fork")
    start = context.Event()
    runs = [context.Process(target=_writer, args=(str(tmp_path), who, start)) for who in ("a", "b")]
    for run in runs:
        run.start()
    start.set()
    for run in runs:
        run.join(timeout=120)
        assert run.exitcode == 0
    cache = ResponseCache(tmp_path)
    for key in KEYS:
        entry = json.loads(cache.path("chat", key).read_bytes())
        assert entry["text"] == f"answer of {entry['who']} " + "x" * 2000
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == len(KEYS) and all(p.suffix == ".json" for p in files)
