"""vlm_decade: measure vision-language models against people, as batch studies on Ray."""

__version__ = "0.1.0"
