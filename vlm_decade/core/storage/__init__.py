"""Object storage: images read from `s3://` or `gs://` URIs, and run folders kept in a bucket.

- `objects`: a file by location, a local path or a URI (exists, size and time, bytes), through
  pyarrow.fs;
- `mirror`: a run folder in a bucket worked on in a local working copy that a `Mirror` keeps in step;
- `lease`: one run per run-folder URI across machines, by the bucket's lease object;
- `shards`, `members`: images in WebDataset tar or Parquet shards, streamed shard by shard, and the
  location of one of them that `read_bytes`, `stat` and `file_problem` read like a file's.

The package gives the names its callers use, `StoreError` among them (`core.errors`: what a store
that fails raises).
"""

from vlm_decade.core.errors import StoreError
from vlm_decade.core.storage.lease import LEASE, LEASE_RENEW_S, LEASE_STALE_S, Lease, LeaseHeld
from vlm_decade.core.storage.members import Member
from vlm_decade.core.storage.mirror import LOCAL_ONLY, MANIFEST, MIRROR_FILE, Mirror, working_copy
from vlm_decade.core.storage.objects import (
    GCS_EMULATOR,
    SCHEMES,
    file_problem,
    is_folder,
    is_uri,
    join,
    read_bytes,
    stat,
    uri_problem,
)
from vlm_decade.core.storage.objects import (
    shard_member as member,
)
from vlm_decade.core.storage.shards import IMAGE_EXTENSIONS, ShardError, ShardPatterns, expand, read_shard, split_key

__all__ = [
    "GCS_EMULATOR",
    "IMAGE_EXTENSIONS",
    "LEASE",
    "LEASE_RENEW_S",
    "LEASE_STALE_S",
    "LOCAL_ONLY",
    "MANIFEST",
    "MIRROR_FILE",
    "SCHEMES",
    "Lease",
    "Member",
    "LeaseHeld",
    "Mirror",
    "ShardError",
    "ShardPatterns",
    "StoreError",
    "expand",
    "file_problem",
    "is_folder",
    "is_uri",
    "join",
    "member",
    "read_bytes",
    "read_shard",
    "split_key",
    "stat",
    "uri_problem",
    "working_copy",
]
