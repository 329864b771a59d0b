"""Triton kernels of the Lighthouse layer, one module per pipeline stage (mirroring `lighthouse/`).

Each takes tensors and plain numbers, imports nothing else of the project, and is tested against its
pure-PyTorch reference in `tests/kernels/test_<stage>.py`; `lighthouse/fused.py` composes them into the
layer. Importing this package builds nothing: Triton decides when a submodule is imported whether its kernels
run compiled or interpreted (TRITON_INTERPRET=1). Not named `kernels`: transformers (>= 5.25) requires Hugging Face's
`kernels` package, which a top-level `kernels` would shadow (or be shadowed by).
"""
