"""The Llama-3 Lighthouse model: stock parameter names, the swapped attention call, the dense switch, FLOPs."""
import dataclasses

import pytest
import torch

from torchtitan.models.llama3 import Transformer, TransformerModelArgs
from torchtitan.models.utils import get_dense_model_nparams_and_flops
from lighthouse import LighthouseConfig, lighthouse_attention
from models.llama3_lighthouse import FLAVORS, PAPER_FFN_HIDDEN, LighthouseLlama, attention_flops_per_token

SEQ = 256
CONFIG = LighthouseConfig(levels=3, pool=2, topk=16, tile_budget=8, selection="paper")


def tiny_args(lighthouse=CONFIG, dense_layers=(0,)):
    return dataclasses.replace(FLAVORS["debug"], lighthouse=lighthouse, dense_layers=dense_layers, max_seq_len=SEQ)


def stock_args(args):
    """The same architecture as torchtitan's plain Llama-3 arguments."""
    names = {f.name for f in dataclasses.fields(TransformerModelArgs)}
    return TransformerModelArgs(**{n: getattr(args, n) for n in names if n != "_enforced"})


def random_tokens(batch=2):
    return torch.randint(0, FLAVORS["debug"].vocab_size, (batch, SEQ))


@pytest.mark.parametrize("flavor", ["debug", "paper"])
def test_parameters_are_named_and_shaped_as_stock_llama3(flavor):
    args = dataclasses.replace(FLAVORS[flavor], lighthouse=CONFIG, dense_layers=(0,))
    with torch.device("meta"):
        ours, stock = LighthouseLlama(args), Transformer(stock_args(args))
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in stock.state_dict().items()}


def test_paper_model_has_ffn_width_1536_and_the_counted_parameters():
    args = FLAVORS["paper"]
    with torch.device("meta"):
        model = LighthouseLlama(args)
    for block in model.layers.values():
        ffn = block.feed_forward
        assert ffn.w1.weight.shape == ffn.w3.weight.shape == (PAPER_FFN_HIDDEN, args.dim)
        assert ffn.w2.weight.shape == (args.dim, PAPER_FFN_HIDDEN)
    d, layers, vocab = args.dim, args.n_layers, args.vocab_size
    per_layer = 4 * d * d + 3 * d * PAPER_FFN_HIDDEN + 2 * d  # q, k, v, o; w1, w2, w3; two RMSNorms
    expected = 2 * vocab * d + layers * per_layer + d  # embedding, output, final norm
    assert args.get_nparams_and_flops(model, 98304)[0] == expected
    assert (args.dim // args.n_heads, args.n_heads, layers, vocab) == (128, 8, 30, 258)


def test_all_dense_model_computes_exactly_stock_llama3():
    args = tiny_args(lighthouse=None)
    ours, stock = LighthouseLlama(args), Transformer(stock_args(args))
    ours.load_state_dict(stock.state_dict())
    tokens = random_tokens()
    assert torch.equal(ours(tokens), stock(tokens))


def test_one_level_lighthouse_layers_match_dense_sdpa():
    # SPEC: L = 1 is plain causal attention, so this checks the [B, N, heads, D] wiring, GQA included.
    one_level = LighthouseConfig(levels=1, pool=2, topk=16, tile_budget=8, selection="paper")
    lighthouse, dense = LighthouseLlama(tiny_args(one_level, ())), LighthouseLlama(tiny_args(None, ()))
    dense.load_state_dict(lighthouse.state_dict())
    tokens = random_tokens()
    torch.testing.assert_close(lighthouse(tokens), dense(tokens), rtol=1e-5, atol=1e-5)


def test_lighthouse_layer_output_is_wo_of_lighthouse_attention_on_its_rope_qkv():
    model = LighthouseLlama(tiny_args())
    attention = model.layers["2"].attention
    seen = []
    attention.selection_observer = lambda q, k, v: seen.append((q, k, v))
    x = torch.randn(2, SEQ, model.model_args.dim)
    out = attention(x, model.freqs_cis, None)
    (q, k, v), = seen
    assert q.shape == (2, SEQ, 4, 32) and k.shape == v.shape == (2, SEQ, 2, 32) and attention.lighthouse == CONFIG
    expected = attention.wo(lighthouse_attention(q, k, v, CONFIG).reshape(2, SEQ, -1))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_only_non_dense_layers_run_lighthouse_and_the_switch_turns_them_dense():
    model = LighthouseLlama(tiny_args(dense_layers=(0, 3)))
    assert [i for i, b in model.layers.items() if b.attention.use_lighthouse] == ["1", "2"]
    dense = LighthouseLlama(tiny_args(lighthouse=None))
    dense.load_state_dict(model.state_dict())
    tokens = random_tokens()
    before = model(tokens)
    model.set_lighthouse_enabled(False)
    after = model(tokens)
    assert not torch.allclose(before, after)
    assert torch.equal(after, dense(tokens))


@pytest.mark.parametrize("scorer", ["norm", "dilated"])
def test_flops_count_lighthouse_layers_over_s_instead_of_n(scorer):
    config = LighthouseConfig(levels=3, pool=2, topk=1536, scorer=scorer, dilation=4, selection="paper")
    args = dataclasses.replace(FLAVORS["paper"], lighthouse=config, dense_layers=(0, 1, 28, 29))
    with torch.device("meta"):
        model = LighthouseLlama(args)
    n, h, d = 98304, args.n_heads, args.dim // args.n_heads
    _, stock_flops = get_dense_model_nparams_and_flops(args, model, 2 * d, n)
    s = config.gathered_len(n)
    per_layer = 6 * h * 2 * d * s * s // n + (4 * h * 2 * d * n // 4 if scorer == "dilated" else 0)
    expected = stock_flops + 26 * (per_layer - 6 * h * 2 * d * n)
    assert args.get_nparams_and_flops(model, n)[1] == expected
    assert attention_flops_per_token(h, d, n, None) == 6 * h * 2 * d * n
    assert dataclasses.replace(args, lighthouse=None).get_nparams_and_flops(model, n)[1] == stock_flops
