"""Study A's human experiments, run as the paper ran them (docs/human.md).

`design` lays out the description, ranking and rating experiments as seeded design tables and
writes the experiment folder; `importing` turns the data jsPsych saved into the descriptions, votes
and ratings tables the study reads, with its exclusions; `reliability` measures how stable the gold
standard and how consistent the ratings are, and plans how many participants a study needs.
"""
