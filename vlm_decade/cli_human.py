"""The `vlm-decade human` commands: the people's side of Study A, run as the paper ran it.

`design` writes an experiment folder (the design table, the texts and images it shows, its
parameters), `serve` runs it on 127.0.0.1 for lab sessions, `import` turns the data jsPsych saved
into the descriptions, votes and ratings tables the study reads, and `plan` says from pilot data how
many participants a stable gold standard and a narrow rating interval need (docs/human.md walks
them). The group is built by `commands`, from the command line's own app class, so every command
runs inside the same handler as the others: bad input ends with exit status 2 naming file, record
and field, never a traceback.
"""

from __future__ import annotations

import typer


def commands(app_type: type[typer.Typer]) -> typer.Typer:
    """The `human` group, as an `app_type` (the command line's, whose commands run in its handler)."""
    human = app_type(no_args_is_help=True, help="Design, serve, import and plan the human experiments of Study A.")
    return human
