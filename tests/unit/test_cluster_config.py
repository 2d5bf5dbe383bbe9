"""cluster.yaml is a valid Ray cluster-launcher config (checked against the schema Ray ships)."""

import json
from pathlib import Path

import jsonschema
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
