"""What both studies' reports are made of; each study draws its own figures and sections
(`vlm_decade.studies.<study>.report`).

- `html.py`: the Jinja environment, tables from Arrow as cells, and the one CSV writer.
- `figures.py`: a matplotlib figure drawn off-screen and written into the run folder.
- `samples.py`: bounded per-image content: a model's worst and best rows, embedded thumbnails.
- `templates/`: the page and the macros every study's templates share.
"""
