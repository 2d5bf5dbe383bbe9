"""cluster.yaml is a valid Ray cluster-launcher config (checked against the schema Ray ships)."""

import json
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml

REPO = Path(__file__).resolve().parents[2]


def test_cluster_yaml_matches_rays_schema():
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    jsonschema.validate(config, schema)
    workers = [t for name, t in config["available_node_types"].items() if name != config["head_node_type"]]
    assert any(t["resources"].get("GPU", 0) >= 1 and t["max_workers"] > t.get("min_workers", 0) for t in workers)
    assert any("pip install" in c and "vlm_decade" in c for c in config["setup_commands"])
    assert all("--disable-usage-stats" in c for c in config["head_start_ray_commands"] if "ray start" in c)


def test_a_broken_cluster_yaml_is_caught():
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    config["max_workers"] = "eight"
    try:
        jsonschema.validate(config, schema)
    except jsonschema.ValidationError:
        return
    raise AssertionError("the schema accepted max_workers: 'eight'")


def _with_engine_node() -> dict:
    """cluster.yaml with its commented engine-node block uncommented."""
    lines = (REPO / "cluster.yaml").read_text().splitlines()
    begin, end = lines.index("  # BEGIN engine node"), lines.index("  # END engine node")
    block = [line.replace("  # ", "  ", 1) for line in lines[begin + 1 : end]]
    return yaml.safe_load("\n".join(lines[:begin] + block + lines[end + 1 :]))


def test_the_engine_node_uncommented_is_valid_and_serves_what_the_example_study_names():
    from vlm_decade.studies import load_study

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    config = _with_engine_node()
    jsonschema.validate(config, schema)
    engine = config["available_node_types"]["vllm_engine"]
    assert engine["min_workers"] == engine["max_workers"] == 1  # started with the cluster, never scaled away
    assert "GPU" not in engine["resources"] and engine["resources"]["vllm_engine"] == 1  # no actor beside vLLM
    # Its setup commands replace the common ones: the package (and so the head's Ray) must be among them.
    assert any("pip install" in c and "/home/ubuntu/vlm_decade" in c for c in engine["worker_setup_commands"])
    serve = next(c for c in engine["worker_setup_commands"] if "vllm serve" in c).split()
    study = load_study(REPO / "docs" / "examples" / "engine_study.yaml")  # the study file parses (no server asked)
    served = study.providers.endpoints["gpu-vllm"]
    model = next(m for m in study.models if m.endpoint == "gpu-vllm")
    assert serve[serve.index("serve") + 1] == model.model_id
    assert served.base_url.endswith(f":{serve[serve.index('--port') + 1]}/v1")
    assert served.max_concurrency == int(serve[serve.index("--max-num-seqs") + 1]) and served.adaptive
    assert served.free


@pytest.mark.parametrize("name", ["engine_study.yaml", "gpu_study.yaml", "openworld_gpu.yaml"])
def test_each_example_study_in_the_docs_parses_as_its_study(name):
    """The docs' example study files are what `vlm-decade run` would load (their config; no data,
    weights or server asked), and docs/examples holds no other."""
    from vlm_decade.studies import load_study

    assert sorted(p.name for p in (REPO / "docs" / "examples").glob("*.yaml")) == [
        "engine_study.yaml",
        "gpu_study.yaml",
        "openworld_gpu.yaml",
    ]
    study = load_study(REPO / "docs" / "examples" / name)
    assert type(study).__name__ == ("OpenWorldStudyConfig" if name.startswith("openworld") else "StudyConfig")
    assert study.models and all(m.name for m in study.models)
