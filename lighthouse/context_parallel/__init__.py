"""Context parallelism for Lighthouse layers (SPEC section 6), in one package:

- `geometry`: which chunks a rank holds, the per-chunk config, the halo owner map, the start-up check;
- `ring`: ring attention through torch's CP dispatcher (every private torch call lives there);
- `halos`: the causal scores before each chunk and the scatter-back spills, exchanged between ranks;
- `shard`: the layer's op (either implementation, `lighthouse.pipeline`) on a shard's head and tail chunks as a
  batch of chunks;
- `layer`: the CP layer and its module.
"""
from .geometry import (
    check_context_parallel,
    chunk_config,
    halo_destinations,
    halo_sources,
    offset_selection,
    owned_chunks,
)
from .halos import all_gather_stacked
from .layer import (
    ContextParallelLighthouseAttention,
    context_parallel_lighthouse_attention,
    shard_selections,
)
from .ring import enable_context_parallel, ring_causal_attention, ring_options

__all__ = [
    "ContextParallelLighthouseAttention",
    "all_gather_stacked",
    "check_context_parallel",
    "chunk_config",
    "context_parallel_lighthouse_attention",
    "enable_context_parallel",
    "halo_destinations",
    "halo_sources",
    "offset_selection",
    "owned_chunks",
    "ring_causal_attention",
    "ring_options",
    "shard_selections",
]
