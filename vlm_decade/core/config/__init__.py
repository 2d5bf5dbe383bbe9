"""The config types both studies share, and how a study file becomes config objects.

- `settings`: `Settings`, the frozen section every part of a study file is, `BackendOptions`, and
  the field kinds (`operational`, `for_studies`, `registry_field`, `FolderLocation`);
- `sections`: the sections both studies share (models, encoders, metrics, statistics, analysis,
  runtime) and `StudyBase`, what every study file holds;
- `providers`: the APIs a study sends to, cloud providers and named endpoints;
- `prices`: the built-in list prices and how a model id is priced;
- `studyfile`: reading a study file's YAML, its paths made absolute, the run folder it names checked;
- `messages`: a validation error as the study file's author reads it, a backend's options checked;
- `reference`: the field tables and JSON Schema that `vlm-decade schema` and the docs show.

Each study adds its own sections (`vlm_decade.studies.<study>.config`). The names callers use are
given here.
"""

from vlm_decade.core.config.messages import check_options, error_message, field_path, range_text
from vlm_decade.core.config.prices import DEFAULT_PRICES, Price, longest_prefix, price_table_markdown, stale_prices
from vlm_decade.core.config.providers import APIConfig, EndpointConfig, ProviderConfig, ProvidersConfig, api_of
from vlm_decade.core.config.reference import json_schema, options_markdown, reference_markdown
from vlm_decade.core.config.sections import (
    MAX_RESAMPLES,
    MAX_SEED,
    MINILM,
    AnalysisConfig,
    EncoderConfig,
    MetricConfig,
    ModelConfig,
    RuntimeConfig,
    StatisticsConfig,
    StudyBase,
    no_batches_of_an_endpoint,
    repeated,
)
from vlm_decade.core.config.settings import (
    BackendOptions,
    FolderLocation,
    Settings,
    operational,
    set_for_other_studies,
)
from vlm_decade.core.config.studyfile import output_problems, read_study_file, resolve_path, resolve_paths

__all__ = [
    "DEFAULT_PRICES",
    "MAX_RESAMPLES",
    "MAX_SEED",
    "MINILM",
    "APIConfig",
    "AnalysisConfig",
    "BackendOptions",
    "EncoderConfig",
    "EndpointConfig",
    "FolderLocation",
    "MetricConfig",
    "ModelConfig",
    "Price",
    "ProviderConfig",
    "ProvidersConfig",
    "RuntimeConfig",
    "Settings",
    "StatisticsConfig",
    "StudyBase",
    "api_of",
    "check_options",
    "error_message",
    "field_path",
    "json_schema",
    "longest_prefix",
    "no_batches_of_an_endpoint",
    "operational",
    "options_markdown",
    "output_problems",
    "price_table_markdown",
    "range_text",
    "read_study_file",
    "reference_markdown",
    "repeated",
    "resolve_path",
    "resolve_paths",
    "set_for_other_studies",
    "stale_prices",
]
