"""torch's DTensor caches, emptied at the end of a job (`recipe.resilience.teardown.end_process_groups`): they hold
device
meshes, and through them process groups."""
from __future__ import annotations

import functools
import gc


def release_dtensor_caches() -> None:
    """Empty torch's DTensor caches, which keep device meshes (and through them process groups) alive: the
    sharding propagation and redistribute-planner caches, and every lru_cache of `torch.distributed`."""
    from torch.distributed.tensor import _redistribute
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    _redistribute.clear_redistribute_planner_cache()
    for cache in gc.get_objects():  # type(), not isinstance: a dead weak proxy raises on isinstance
        if type(cache) is functools._lru_cache_wrapper and (cache.__module__ or "").startswith("torch.distributed."):
            cache.cache_clear()
