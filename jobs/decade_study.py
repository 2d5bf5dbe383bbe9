"""Study A as a Ray job: `ray job submit --working-dir . -- python jobs/decade_study.py --config STUDY.yaml`.

The job's driver joins the cluster that runs it (Ray sets RAY_ADDRESS for submitted jobs) and
alone writes the run folder; `--demo` runs the bundled offline demo study instead of a config.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from vlm_decade.job import main

if __name__ == "__main__":
    sys.exit(main("decade", __doc__))
