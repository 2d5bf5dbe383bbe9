"""Running the resampling: blocks of whole chunks, in-process or as Ray tasks.

`resample_means` (ordinary bootstrap) gives each task a contiguous range of whole chunks of
resamples; a chunk is always computed the same way (same stream, same matrix shapes), so results
are identical whatever the number of tasks. `poisson_resample_means` (huge studies) splits the
*images* into fixed-size shards; each task draws Poisson(1) weights for its shard and returns
partial sums, which the driver adds in shard order. Ray is used when it is initialised (or when
asked); otherwise everything runs in this process with the same functions.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from vlm_decade.stats import _core, _streams

RAY_GET_TIMEOUT_S = 1800.0  # a bootstrap that takes longer than this is stuck, not slow
POISSON_SHARD = 25_000  # images per Poisson shard: part of the results' definition, like CHUNK
# What a shard's kept sums were computed by: change it with `_poisson_shard`'s draws or arithmetic.
SHARD_SUMS_VERSION = 1


def _multinomial_block(values, mask, streams, sizes) -> np.ndarray:
    """(sum(sizes), S) resampled means for some consecutive chunks, one stream per chunk, their
    counts drawn into one matrix in turn (`multinomial_counts`' `out`); each resample's counts sum
    to its n draws."""
    n = values.shape[1]
    counts = np.empty((max(sizes), n))
    out = [
        _core.weighted_means(
            _core.multinomial_counts(np.random.default_rng(ss), size, n, out=counts[:size]), values, mask, rows_sum_to=n
        )
        for ss, size in zip(streams, sizes)
    ]
    return np.concatenate(out, axis=0)


def _poisson_shard(values, mask, stream, n_resamples) -> tuple[np.ndarray, np.ndarray]:
    """Partial sums (weighted sums, weight totals), each (B, S), of one image shard."""
    rng = np.random.default_rng(stream)
    s, n = values.shape
    sums = np.empty((n_resamples, s))
    totals = np.empty((n_resamples, s))
    start = 0
    for size in _streams.chunk_sizes(n_resamples):  # bounded memory: CHUNK x shard weights
        w = _core.poisson_counts(rng, size, n)
        sums[start : start + size], totals[start : start + size] = _core.weighted_sums(w, values, mask)
        start += size
    return sums, totals


def _ray_wanted(use_ray: bool | None) -> bool:
    if use_ray is False:
        return False
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a dependency
        if use_ray:
            raise
        return False
    if use_ray and not ray.is_initialized():
        raise RuntimeError("use_ray=True but Ray is not initialised (call vlm_decade.core.runtime.start_ray())")
    return ray.is_initialized()


def _default_tasks() -> int:
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


_REMOTE: dict[str, object] = {}


def _remote(name: str):
    """Ray remote versions of the block functions, made once per process."""
    if name not in _REMOTE:
        import ray

        fn = {"multinomial": _multinomial_block, "poisson": _poisson_shard}[name]
        _REMOTE[name] = ray.remote(num_cpus=1, num_returns=2 if name == "poisson" else 1)(fn)
    return _REMOTE[name]


def _get(refs):
    import ray

    return ray.get(refs, timeout=RAY_GET_TIMEOUT_S)


def warm_workers(ray) -> list:
    """Start the bootstrap's task workers ahead, one per CPU of the cluster (the tasks a bootstrap
    runs at once), while a stage before it works: each loads this module and runs a block of one
    resample, so that the bootstrap's own tasks find them started (a worker's start and imports
    took about a third of a 110,000-image bootstrap's time). Tasks, not actors: nothing is left to
    let go, hence the empty list (`Stage.warm`)."""
    block = _remote("multinomial")
    streams = _streams.chunk_streams(0, "warm", _streams.KIND_MULTINOMIAL, 1)
    for _ in range(_default_tasks()):
        block.remote(np.zeros((1, 1)), np.ones((1, 1)), streams, [1])
    return []


def resample_means_many(
    jobs: dict[str, tuple[np.ndarray, np.ndarray]],
    n_resamples: int,
    seed: int,
    *,
    use_ray: bool | None = None,
    n_tasks: int | None = None,
) -> dict[str, np.ndarray]:
    """Ordinary bootstrap of many datasets at once: name -> (values, mask) gives name -> (S, B).

    The stream of dataset `name` depends on (seed, name) only. With Ray, every dataset's blocks
    are submitted before any result is awaited, so all cores stay busy.
    """
    sizes = _streams.chunk_sizes(n_resamples)
    ray_on = _ray_wanted(use_ray)
    tasks = n_tasks or (_default_tasks() if ray_on else 1)
    pending: dict[str, list] = {}
    for name, (values, mask) in jobs.items():
        streams = _streams.chunk_streams(seed, name, _streams.KIND_MULTINOMIAL, len(sizes))
        ranges = _streams.split_chunks(len(sizes), tasks)
        if ray_on:
            import ray

            v_ref, m_ref = ray.put(values), ray.put(mask)
            fn = _remote("multinomial")
            pending[name] = [
                fn.remote(v_ref, m_ref, streams[r.start : r.stop], sizes[r.start : r.stop]) for r in ranges
            ]
        else:
            pending[name] = [
                _multinomial_block(values, mask, streams[r.start : r.stop], sizes[r.start : r.stop]) for r in ranges
            ]
    out = {}
    for name, blocks in pending.items():
        if ray_on:
            blocks = _get(blocks)
        out[name] = np.concatenate(blocks, axis=0).T
    return out


def resample_means(values, mask, n_resamples: int, seed: int, name: str, **kw) -> np.ndarray:
    """(S, B) ordinary-bootstrap means of one dataset's series; see `resample_means_many`."""
    return resample_means_many({name: (values, mask)}, n_resamples, seed, **kw)[name]


def shard_key(seed: int, name: str, shard: int, n_resamples: int, values: np.ndarray, mask: np.ndarray) -> bytes:
    """What shard `shard` of dataset `name`'s Poisson partial sums depend on, hashed: its stream (seed,
    name, place), the resamples, its scores and mask to the byte, and the code, numpy and scipy (its
    Poisson CDF makes the draws' table) that drew and summed them (`shards.ShardSums`)."""
    import scipy

    head = [SHARD_SUMS_VERSION, np.__version__, scipy.__version__, _streams.CHUNK, seed, name, shard, n_resamples]
    digest = hashlib.sha256(json.dumps(head + [values.shape, values.dtype.str, mask.dtype.str]).encode())
    digest.update(np.ascontiguousarray(values).tobytes())
    digest.update(np.ascontiguousarray(mask).tobytes())
    return digest.digest()


def poisson_partial_sums_many(
    jobs: dict[str, tuple[np.ndarray, np.ndarray]],
    n_resamples: int,
    seed: int,
    *,
    shard_size: int = POISSON_SHARD,
    use_ray: bool | None = None,
    kept=None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Poisson bootstrap: name -> (values, mask) gives name -> (sums, totals), each (B, S).

    Shard k of a dataset (images [k*shard_size, (k+1)*shard_size)) always uses child k of the
    dataset's Poisson stream, and partial sums are added in shard order, so the result does not
    depend on how many tasks or workers ran. `kept` (a `shards.ShardSums`): a shard whose key it
    knows is not computed again, and every shard's sums are put in it.
    """
    ray_on = _ray_wanted(use_ray)
    pending = {}
    for name, (values, mask) in jobs.items():
        n = values.shape[1]
        n_shards = max(1, -(-n // shard_size))
        streams = _streams.chunk_streams(seed, name, _streams.KIND_POISSON, n_shards)
        parts = []  # per shard: (key, its kept sums or None, its computation: sums or Ray refs, or None)
        for k in range(n_shards):
            sl = slice(k * shard_size, (k + 1) * shard_size)
            v, m = np.ascontiguousarray(values[:, sl]), np.ascontiguousarray(mask[:, sl])
            key = None if kept is None else shard_key(seed, name, k, n_resamples, v, m)
            found = None if key is None else kept.get(key)
            if found is not None:
                parts.append((key, found, None))
            elif ray_on:
                parts.append((key, None, _remote("poisson").remote(v, m, streams[k], n_resamples)))
            else:
                parts.append((key, None, _poisson_shard(v, m, streams[k], n_resamples)))
        pending[name] = parts
    out = {}
    for name, parts in pending.items():
        sums = totals = None
        for key, found, computed in parts:  # fixed order: deterministic floating-point sums
            if found is None:
                found = tuple(_get(list(computed))) if ray_on else computed
                if kept is not None:
                    kept.put(key, *found)
            if sums is None:
                sums, totals = np.zeros_like(found[0]), np.zeros_like(found[1])
            sums += found[0]
            totals += found[1]
        out[name] = (sums, totals)
    return out


def poisson_resample_means(values, mask, n_resamples: int, seed: int, name: str, **kw) -> np.ndarray:
    """(S, B) Poisson-bootstrap means of one dataset's series."""
    sums, totals = poisson_partial_sums_many({name: (values, mask)}, n_resamples, seed, **kw)[name]
    return _core.ratio(sums, totals).T
