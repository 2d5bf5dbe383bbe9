"""Study A as a Ray job: `ray job submit --working-dir . -- python jobs/decade_study.py --config STUDY.yaml`.

The job's driver joins the cluster that runs it (Ray sets RAY_ADDRESS for submitted jobs) and
alone writes the run folder; `--demo` runs the bundled offline demo study instead of a config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the uploaded working dir

from vlm_decade.config import load_study  # noqa: E402
from vlm_decade.errors import InputError  # noqa: E402
from vlm_decade.pipeline import run_study  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="the study's YAML file")
    source.add_argument("--demo", action="store_true", help="run the bundled offline demo study")
    parser.add_argument("--out", type=Path, help="run folder (default: the study's `output`, or runs/demo)")
    args = parser.parse_args(argv)
    try:
        if args.demo:
            from vlm_decade.demo import decade_demo

            study = decade_demo(args.out or Path("runs/demo/decade"))
        else:
            study = load_study(args.config, output=args.out)
        run_study(study)
    except InputError as exc:
        print(f"{len(exc.problems)} problem(s) in the input; nothing was run or written:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
