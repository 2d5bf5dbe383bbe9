"""A Study A config whose files need not exist, for the tests of what is worked out from the config
alone (the estimate and its prices)."""

from __future__ import annotations

from vlm_decade.studies.decade.config import StudyConfig


def config_only_study(**fields) -> StudyConfig:
    """One imported model over images and descriptions never read; `fields`: the study's others."""
    return StudyConfig.model_validate(
        {
            "name": "s",
            "data": {"images": "i.csv", "image_dir": ".", "descriptions": "d.csv"},
            "models": [{"name": "m", "backend": "imported", "model_id": "m", "era": "mllm"}],
            **fields,
        }
    )
