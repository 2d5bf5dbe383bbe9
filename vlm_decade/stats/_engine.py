"""Running the resampling: blocks of whole chunks, in-process or as Ray tasks.

`resample_means` (ordinary bootstrap) gives each task a contiguous range of whole chunks of
resamples; a chunk is always computed the same way (same stream, same matrix shapes), so results
are identical whatever the number of tasks. `poisson_resample_means` (huge studies) splits the
*images* into fixed-size shards; each task draws Poisson(1) weights for its shard and returns
partial sums, which the driver adds in shard order. Ray is used when it is initialised (or when
asked); otherwise everything runs in this process with the same functions.
"""

from __future__ import annotations

import numpy as np

from vlm_decade.stats import _core, _streams

RAY_GET_TIMEOUT_S = 1800.0  # a bootstrap that takes longer than this is stuck, not slow
POISSON_SHARD = 25_000  # images per Poisson shard: part of the results' definition, like CHUNK


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


def poisson_partial_sums_many(
    jobs: dict[str, tuple[np.ndarray, np.ndarray]],
    n_resamples: int,
    seed: int,
    *,
    shard_size: int = POISSON_SHARD,
    use_ray: bool | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Poisson bootstrap: name -> (values, mask) gives name -> (sums, totals), each (B, S).

    Shard k of a dataset (images [k*shard_size, (k+1)*shard_size)) always uses child k of the
    dataset's Poisson stream, and partial sums are added in shard order, so the result does not
    depend on how many tasks or workers ran.
    """
    ray_on = _ray_wanted(use_ray)
    pending = {}
    for name, (values, mask) in jobs.items():
        n = values.shape[1]
        n_shards = max(1, -(-n // shard_size))
        streams = _streams.chunk_streams(seed, name, _streams.KIND_POISSON, n_shards)
        parts = []
        for k in range(n_shards):
            sl = slice(k * shard_size, (k + 1) * shard_size)
            v, m = np.ascontiguousarray(values[:, sl]), np.ascontiguousarray(mask[:, sl])
            if ray_on:
                parts.append(_remote("poisson").remote(v, m, streams[k], n_resamples))
            else:
                parts.append(_poisson_shard(v, m, streams[k], n_resamples))
        pending[name] = parts
    out = {}
    for name, parts in pending.items():
        if ray_on:
            parts = [tuple(_get(list(p))) for p in parts]
        sums = np.zeros_like(parts[0][0])
        totals = np.zeros_like(parts[0][1])
        for s, t in parts:  # fixed order: deterministic floating-point sums
            sums += s
            totals += t
        out[name] = (sums, totals)
    return out


def poisson_resample_means(values, mask, n_resamples: int, seed: int, name: str, **kw) -> np.ndarray:
    """(S, B) Poisson-bootstrap means of one dataset's series."""
    sums, totals = poisson_partial_sums_many({name: (values, mask)}, n_resamples, seed, **kw)[name]
    return _core.ratio(sums, totals).T
