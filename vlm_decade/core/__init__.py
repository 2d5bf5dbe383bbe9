"""The spine every study runs on; nothing in it knows what a study measures.

- `config/`: the config types both studies share, and how a study file becomes them;
- `runner`: stages, run only when their inputs or settings changed, and the spine that runs them;
- `runfolder`: the run folder, its tables, manifest, crash-safe parts and lock;
- `reuse`: per-row reuse, a stage computing only the units that are new or changed;
- `fingerprints`: a table's content fingerprint, whatever its chunking;
- `parquet`: how the package writes Parquet and reads a file too big to hold;
- `storage/`: files by local path or object-storage URI, run folders kept in a bucket;
- `dispatch`: the one bounded loop that sends work to Ray, and an actor pool that survives losses;
- `runtime`: starting or joining Ray, with nothing sent off the machine;
- `spill`: rows spread over buckets on disk, for tables too big to group in memory;
- `columns`: small column operations, so stages hold Arrow arrays and no Python object per row;
- `tables`: reading the user's tables (CSV or Parquet), each row with its spreadsheet number;
- `errors`: input problems that name file, row and field, machine errors, exit statuses;
- `progress`: what the person watching is told;
- `smoke`: a smoke run (`run --limit N`), marked as one;
- `registry`: the one registry mechanism, a name imported only when first asked for;
- `names`: the one "did you mean" of every message;
- `hosts`: the loopback names, and the name a request's Host header gives (for the local servers);
- `files`: at the bottom, files written whole, hashed and named safely.
"""
