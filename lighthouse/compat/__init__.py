"""Every private torch call of the algorithm, in one place (the recipe's are in `recipe/compat/`, the kernels'
launch path's in `lighthouse_kernels/compat.py`):

- `sdpa`: the SDPA kernels' own forward and backward aten ops (`aten._scaled_dot_product_*`), which the fused
  layer calls without SDPA's dispatch and autograd node;
- `context_parallel`: torch's context-parallel dispatcher (ring attention on DTensors sharded along the
  sequence, its options and rotation) and the CPU ring handlers added to it.

Nothing here patches on import; the CP dispatcher is turned on by `lighthouse.context_parallel.enable_context_parallel`.
"""
