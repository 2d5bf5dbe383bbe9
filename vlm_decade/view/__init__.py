"""`vlm-decade view`: a local web app over a run folder, to look at the images behind the numbers.

Study A: a gallery of images (filter by dataset, model, error type and SDE; sort by a model's
similarity or its gap to the top-ranked humans), one page per image (its masked variants, the human
and model descriptions with their similarities, the error labels with their evidence, the heat map)
and one page per model. Study B: a gallery of labelled images with every model's prediction, its
metrics and outcome. `runs` opens the run folder (DuckDB over its Parquet tables), `verify` checks
what may be shown (tables against the manifest, images against their sha256, the `.view/` cache),
`decade` and `openworld` are the studies' pages as queries (sharing `gallery`; `pages` is what a
study's pages offer, found through its registration), `pictures` makes the thumbnails and variants,
`access` checks who asks (Host, token) and sets the headers, `app` serves them, the same routes for
every study.
"""
