"""Shared test set-up: nothing may reach the network, so hub lookups are switched off; the code of
remote-code checkpoints the tests load is copied into a folder of the run, not the user's cache."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="vlm-decade-hf-modules-"))
