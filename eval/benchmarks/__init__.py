"""Benchmarks and parity checks: the attention layer, training throughput, context parallelism, maximum
context, GPU parity and FlashAttention."""
