"""Model arguments: torchtitan's Llama-3 arguments plus where Lighthouse runs, and the FLOP count."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torchtitan.models.llama3 import TransformerModelArgs
from torchtitan.models.llama3.model.args import RoPEScalingArgs
from torchtitan.models.utils import get_dense_model_nparams_and_flops

from lighthouse import LighthouseConfig

# The byte vocabulary the flavors' embeddings are sized for: the 256 byte values plus BOS and EOS, as in the
# paper (`recipe.data.tokenizer.ByteTokenizer` encodes text into it).
NUM_BYTES = 256
BOS_ID = NUM_BYTES
EOS_ID = NUM_BYTES + 1
VOCAB_SIZE = NUM_BYTES + 2


def attention_flops_per_token(n_heads: int, head_dim: int, seq_len: int, config: LighthouseConfig | None) -> int:
    """Training FLOPs per token of one attention layer's score and value matmuls (forward + backward).

    Dense (config None): torchtitan's convention, 6 * H * 2D * N, causal masking not discounted.
    Lighthouse: the same convention for dense SDPA over the S gathered entries, spread over the N tokens,
    6 * H * 2D * S**2 / N; with the dilated scorer, plus its two forward-only strided attentions,
    2 * (2 * H * 2D * N / dilation). Pooling, norm scoring, selection, gather and scatter are O(N * D)
    elementwise work and not counted.
    """
    if config is None:
        return 6 * n_heads * 2 * head_dim * seq_len
    s = config.gathered_len(seq_len)
    flops = 6 * n_heads * 2 * head_dim * s * s // seq_len
    if config.scorer == "dilated":
        flops += 2 * 2 * n_heads * 2 * head_dim * seq_len // config.dilation
    return flops


@dataclass
class LighthouseLlamaArgs(TransformerModelArgs):
    lighthouse: LighthouseConfig | None = None
    """Settings of the Lighthouse layers; None runs dense causal SDPA in every layer."""

    dense_layers: tuple[int, ...] = ()
    """Layers that always run dense causal SDPA."""

    dense_backend: str = "auto"
    """Kernel of dense causal attention, in `dense_layers` and wherever Lighthouse is off (`dense.DENSE_BACKENDS`)."""

    hf_shape: bool = False
    """Shape and RoPE were taken from a Hugging Face config.json (flavor hf): its vocabulary stays, and the job's
    `[rope]` replaces its RoPE only with `rope.change_imported`."""

    loss_chunk_tokens: int = 2048
    """Tokens per chunk of the fused output loss (`OutputLayer`): one chunk's float32 logits are its largest tensor."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def lighthouse_layers(self) -> list[int]:
        """Indices of the layers that run Lighthouse (none when `lighthouse` is None)."""
        if self.lighthouse is None:
            return []
        return [i for i in range(self.n_layers) if i not in self.dense_layers]

    def update_from_config(self, job_config, **kwargs) -> None:
        """Take `seq_len` (torchtitan), the `[lighthouse]` section and the `[rope]` section of the job.

        `max_seq_len`, the RoPE table's length, is the job's `training.seq_len`, as torchtitan sets it; set
        first, so a long-context job is not warned that it "exceeds original maximum": these models are
        trained at that length from scratch, with no original context to exceed."""
        self.max_seq_len = job_config.training.seq_len
        super().update_from_config(job_config, **kwargs)
        section = job_config.lighthouse
        self.lighthouse = section.to_config() if section.enable else None
        self.dense_layers = tuple(section.dense_layers)
        self.dense_backend = section.dense_backend
        loss = getattr(job_config, "loss", None)  # absent from torchtitan's own config: the default chunk stays
        if loss is not None:
            self.loss_chunk_tokens = loss.chunk_tokens
        rope = getattr(job_config, "rope", None)  # absent from torchtitan's own config: the flavor's RoPE stays
        if rope is not None and not (self.hf_shape and not rope.change_imported):
            self.rope_theta = rope.theta
            self.rope_scaling_args = RoPEScalingArgs(rope.scaling_factor, rope.low_freq_factor, rope.high_freq_factor,
                                                     rope.original_max_position_embeddings)

    def get_nparams_and_flops(self, model: nn.Module, seq_len: int) -> tuple[int, int]:
        """torchtitan's dense count with each Lighthouse layer's attention term taken over S, not N."""
        nparams, flops = get_dense_model_nparams_and_flops(self, model, 2 * self.head_dim, seq_len)
        dense = attention_flops_per_token(self.n_heads, self.head_dim, seq_len, None)
        lighthouse = attention_flops_per_token(self.n_heads, self.head_dim, seq_len, self.lighthouse)
        return nparams, flops + len(self.lighthouse_layers()) * (lighthouse - dense)
