"""GPU placement without a GPU: a local Ray that declares two GPUs it does not have. Each local
model's actor asks for its share (`runtime.gpus_per_actor`) and is given it, the actors spread over
the declared GPUs, and the device a Hugging Face backend would choose (`hf_common.placement`) is
the card Ray assigned, CUDA itself faked at the boundary, inside the actor, from the devices Ray
made visible. A study asking for more GPUs than there are is refused by `validate` (exit 2, naming
the field) and, given straight to the stage, before any actor starts."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from typer.testing import CliRunner

from vlm_decade.models.backends import Description
from vlm_decade.stages.describe import local
from vlm_decade.stages.describe.local import DescribeActor

from .conftest import describe_stage

pytestmark = pytest.mark.ray
KEEP = ["astronaut", "chelsea", "coffee", "motorcycle"]
GPUS = 2
PROBES = "VLM_DECADE_GPU_PROBES"  # the folder where each actor writes its facts


@pytest.fixture(scope="module", autouse=True)
def two_gpus(ray_session, tmp_path_factory):
    """The session's Ray replaced, for this module, by one that declares GPUS GPUs, then restored.
    Its workers find the probes' folder in their environment (PROBES)."""
    from vlm_decade.core.runtime import start_ray

    ray_session.shutdown()
    os.environ[PROBES] = str(tmp_path_factory.mktemp("probes"))
    ray = start_ray(num_cpus=2, num_gpus=GPUS)
    yield ray
    ray.shutdown()
    os.environ.pop(PROBES)
    start_ray(num_cpus=2)


class Facts:
    """A backend that writes what its actor was given, and where its model would go, for the test
    to read, and answers once every actor of the model has: otherwise the first to start could take
    all the work and the pool end the others before they were made."""

    def __init__(self, facts: dict):
        self.folder = Path(os.environ[PROBES])
        (self.folder / f"{os.getpid()}.json").write_text(json.dumps(facts))

    def describe(self, batch):
        expected = int((self.folder / "actors").read_text())
        deadline = time.monotonic() + 120
        while len(list(self.folder.glob("*.json"))) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        return [Description("ok") for _ in batch]


def fake_cuda() -> int:
    """torch.cuda as a machine with the devices Ray made visible to this process would have them."""
    import torch

    count = len([d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d])
    torch.cuda.is_available = lambda: count > 0
    torch.cuda.device_count = lambda: count
    torch.cuda.is_bf16_supported = lambda *args, **kwargs: True
    return count


class GPUProbe(DescribeActor):
    """The describe stage's actor, built as the stage builds it, with `Facts` for its backend."""

    def __init__(self, model):
        import ray
        import torch

        from vlm_decade.models.backends.hf_common import placement

        devices = fake_cuda()
        device, dtype, _ = placement({"device": "auto", "dtype": "auto", "device_map": None})
        assigned = ray.get_runtime_context().get_assigned_resources()
        self.backend = Facts(
            {
                "pid": os.getpid(),
                "gpu_ids": sorted(str(i) for i in ray.get_gpu_ids()),
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                "devices": devices,
                "device": device,
                "dtype": str(dtype).removeprefix("torch."),
                "gpu_share": assigned.get("GPU", 0.0),
                "torch_sees": torch.cuda.device_count(),
            }
        )


@pytest.fixture(scope="module")
def small_study(tmp_path_factory):
    from vlm_decade.demo import materialize
    from vlm_decade.studies import load_study
    from vlm_decade.studies.decade.data import load_study_data

    folder = tmp_path_factory.mktemp("study")
    study = load_study(materialize(folder))
    study = study.model_copy(update={"models": tuple(m for m in study.models if m.name == "ssd-template")})
    images = load_study_data(study.data, study.ranking, study.masks).images
    return study, images.filter(pa.compute.is_in(images.column("image_id"), pa.array(KEEP))), folder


def with_gpus(study, gpus_per_actor: float, actors: int):
    runtime = study.runtime.model_copy(
        update={"gpus_per_actor": gpus_per_actor, "actors_per_model": actors, "cpus_per_actor": 0.5}
    )
    model = study.models[0].model_copy(update={"batch_size": 2})
    return study.model_copy(update={"runtime": runtime, "models": (model,)})


def actor_facts(study, images, out, monkeypatch) -> list[dict]:
    """Each actor's facts, written as it started."""
    folder = Path(os.environ[PROBES])
    for old in folder.glob("*.json"):
        old.unlink()
    (folder / "actors").write_text(str(study.runtime.actors_per_model))
    monkeypatch.setattr(local, "DescribeActor", GPUProbe)
    table = describe_stage(study, images, out)
    assert set(table.column("status").to_pylist()) == {"ok"}
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def test_one_gpu_per_actor_spreads_over_the_declared_gpus(small_study, tmp_path, monkeypatch):
    study, images, _ = small_study
    facts = actor_facts(with_gpus(study, 1, GPUS), images, tmp_path / "run", monkeypatch)
    assert len({f["pid"] for f in facts}) == GPUS  # both actors started
    assert sorted(i for f in facts for i in f["gpu_ids"]) == ["0", "1"]  # one card each, not the same one
    for f in facts:
        assert f["gpu_share"] == 1.0 and len(f["gpu_ids"]) == 1
        # torch's cuda:0 in the actor is the card Ray assigned: the only one it sees
        assert f["visible"] == f["gpu_ids"][0] and f["torch_sees"] == 1
        assert (f["device"], f["dtype"]) == ("cuda", "bfloat16")


def test_an_actor_given_two_gpus_sees_both(small_study, tmp_path, monkeypatch):
    """gpus_per_actor: 2, for a model larger than one card (`device_map: auto` spreads it over what
    the actor sees)."""
    study, images, _ = small_study
    (facts,) = actor_facts(with_gpus(study, 2, 1), images, tmp_path / "run", monkeypatch)
    assert facts["gpu_share"] == 2.0 and facts["gpu_ids"] == ["0", "1"]
    assert sorted(facts["visible"].split(",")) == ["0", "1"] and facts["torch_sees"] == 2


def test_fractional_shares_are_given_as_asked(small_study, tmp_path, monkeypatch):
    study, images, _ = small_study
    facts = actor_facts(with_gpus(study, 0.5, 2), images, tmp_path / "run", monkeypatch)
    assert len({f["pid"] for f in facts}) == 2
    for f in facts:
        assert f["gpu_share"] == 0.5 and len(f["gpu_ids"]) == 1 and f["visible"] == f["gpu_ids"][0]
        assert f["device"] == "cuda"


def test_an_actor_without_a_gpu_share_stays_on_the_cpu(small_study, tmp_path, monkeypatch):
    study, images, _ = small_study
    (facts,) = actor_facts(with_gpus(study, 0, 1), images, tmp_path / "run", monkeypatch)
    assert facts["gpu_ids"] == [] and facts["torch_sees"] == 0 and facts["device"] == "cpu"


def test_more_gpus_than_there_are_is_refused_by_validate_and_by_the_stage(small_study, tmp_path, monkeypatch):
    from vlm_decade.cli import app
    from vlm_decade.core.errors import InputError
    from vlm_decade.stages.describe.plan import check_models

    study, images, folder = small_study
    (problem,) = check_models(with_gpus(study, 1, GPUS + 1), None, ["full"])
    assert problem.field == "runtime.gpus_per_actor"
    assert problem.message.startswith("3 actors x 1 GPU = 3 GPU, but this Ray has 2")
    assert check_models(with_gpus(study, 1, GPUS), None, ["full"]) == []

    raw = yaml.safe_load((folder / "study.yaml").read_text())
    raw["runtime"] = {**raw.get("runtime", {}), "gpus_per_actor": 1, "actors_per_model": GPUS + 1}
    (folder / "too_many.yaml").write_text(yaml.safe_dump(raw))
    done = CliRunner().invoke(app, ["validate", str(folder / "too_many.yaml")])
    said = " ".join(done.output.split())
    assert done.exit_code == 2 and "Traceback" not in said and said.startswith("1 problem")
    assert "runtime.gpus_per_actor" in said and "3 actors x 1 GPU = 3 GPU, but this Ray has 2" in said

    monkeypatch.setattr(local, "DescribeActor", GPUProbe)
    with pytest.raises(InputError, match=r"3 actors x 1 GPU = 3 GPU, but this Ray has 2"):
        describe_stage(with_gpus(study, 1, GPUS + 1), images, tmp_path / "run")
