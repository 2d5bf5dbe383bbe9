"""The third study's file: the shared sections (models, statistics, runtime, the run folder) and a
folder of images."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from vlm_decade.core.config import StudyBase


class ThirdConfig(StudyBase):
    """The third study: each image's mean brightness."""

    study: Literal["third"] = Field(description="third: the tests' own study.")
    images: Path = Field(description="A folder of PNG images, one dataset.")

    def option_entries(self) -> list[tuple[tuple, str, dict, type | None]]:
        """No entry beyond the models runs a backend."""
        return []

    def encoder_entries(self) -> list[tuple[tuple, str]]:
        """No encoder."""
        return []
