"""The third study as a Ray job: `ray job submit --working-dir . -- python tests/studies/third/job.py --config STUDY.yaml`.

Its driver registers the study (it is the tests' own, not the package's) and runs the one job main
the package's scripts in jobs/ run; `--demo` runs its demo instead of a config.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the uploaded working dir

from tests.studies.third import THIRD
from vlm_decade.job import main
from vlm_decade.studies.registry import register

if __name__ == "__main__":
    register(THIRD)
    sys.exit(main(THIRD.name, __doc__))
