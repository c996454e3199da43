"""nn.LSTM / nn.GRU / nn.RNN under torch.compile(backend="edgetrain").

TorchDynamo skips every frame that calls an RNN module unless `torch._dynamo.config.allow_rnn`
is set (the model then runs in PyTorch: no graph reaches edgetrain); `allow_rnns()` sets it
when edgetrain registers its backend. Dynamo's graph then calls torch._VF.lstm / gru /
rnn_tanh / rnn_relu, which `replace_rnns` swaps for the decompositions here before
AOTAutograd traces the graph: one cell per time step, in ops edgetrain's converters translate
as they do under et.compile.

PyTorch's own decomposition of those ops (torch/_decomp/decompositions.py, `_rnn_helper`,
which AOTAutograd would run) never applies the inter-layer dropout of a multi-layer RNN in
training mode (its condition `num_layers < i - 1` is never true), while eager applies it after
each layer but the last. The decompositions here are built from PyTorch's own per-layer
functions, with the inter-layer dropout where eager has it: the same draw, in the same order,
from torch's generator. An LSTM is always unrolled one cell per step (PyTorch's picks the fused
aten.mkldnn_rnn_layer for float32, which no converter translates). A PackedSequence goes to
torch's own op (and its decomposition).
"""
from __future__ import annotations

from functools import partial

import torch
from torch._decomp import decompositions as torch_decomp


def _layers(input, hidden, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, layer_fn):
    """Eager's multi-layer loop (aten/src/ATen/native/RNN.cpp, `_rnn_impl`): each layer (both
    directions), then dropout on its output before the next layer."""
    input = input.transpose(0, 1) if batch_first else input
    final_hiddens = []
    for i in range(num_layers):
        cur_params, cur_hidden, bidir_params, bidir_hidden = torch_decomp.params_hiddens(
            params, hidden, i, bidirectional)
        fwd_out, fwd_hidden = layer_fn(input, cur_hidden, cur_params, has_biases)
        final_hiddens.append(fwd_hidden)
        if bidirectional:
            bwd_out, bwd_hidden = layer_fn(input, bidir_hidden, bidir_params, has_biases, reverse=True)
            final_hiddens.append(bwd_hidden)
            input = torch.cat([fwd_out, bwd_out], fwd_out.dim() - 1)
        else:
            input = fwd_out
        if dropout != 0 and train and i < num_layers - 1:
            input = torch.dropout(input, dropout, train=True)
    return (input.transpose(0, 1) if batch_first else input), final_hiddens


def lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    params = torch_decomp.gather_params(params, has_biases, hx[0].size(2) != hx[1].size(2))
    hidden = list(zip(hx[0], hx[1]))
    layer_fn = torch_decomp.one_layer_lstm  # one cell per step, never the fused aten.mkldnn_rnn_layer
    out, final = _layers(input, hidden, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                         layer_fn)
    h, c = zip(*final)
    return out, torch.stack(h, 0), torch.stack(c, 0)


def gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    params = torch_decomp.gather_params(params, has_biases, False)
    layer_fn = partial(torch_decomp.one_layer_rnn, hidden_fn=torch_decomp.gru_cell)
    out, final = _layers(input, hx.unbind(0), params, has_biases, num_layers, dropout, train, bidirectional,
                         batch_first, layer_fn)
    return out, torch.stack(final, 0)


def _rnn(cell, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    params = torch_decomp.gather_params(params, has_biases, False)
    layer_fn = partial(torch_decomp.one_layer_rnn, hidden_fn=torch_decomp.rnn_cell(cell))
    out, final = _layers(input, hx.unbind(0), params, has_biases, num_layers, dropout, train, bidirectional,
                         batch_first, layer_fn)
    return out, torch.stack(final, 0)


def _unpacked(decomposed, packed):
    """`decomposed` for a call on unpacked sequences (hx, or params, a list where the packed
    variant has a tensor), else torch's own op (a PackedSequence)."""
    def call(*args):
        if isinstance(args[1 if packed is torch._VF.lstm else 2], (list, tuple)):
            return decomposed(*args)
        return packed(*args)

    call.__name__ = f"edgetrain_{packed.__name__}"
    return call


#: the RNN functions Dynamo's graph calls (torch._VF.lstm, ...) -> eager's decomposition of them
REPLACEMENTS = {
    torch._VF.lstm: _unpacked(lstm, torch._VF.lstm),
    torch._VF.gru: _unpacked(gru, torch._VF.gru),
    torch._VF.rnn_tanh: _unpacked(partial(_rnn, torch.tanh), torch._VF.rnn_tanh),
    torch._VF.rnn_relu: _unpacked(partial(_rnn, torch.relu), torch._VF.rnn_relu),
}


def replace_rnns(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` (Dynamo's graph, which edgetrain owns) calling the decompositions above in place of
    torch's RNN ops, so that AOTAutograd traces them (its own decomposition of aten.lstm runs
    at the Autograd key, before any decomposition table is consulted)."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in REPLACEMENTS:
            node.target = REPLACEMENTS[node.target]
            changed = True
    if changed:
        gm.recompile()
    return gm


def allow_rnns() -> None:
    """Let TorchDynamo trace nn.LSTM / nn.GRU / nn.RNN into graphs (its default skips the whole
    frame: the model would run in PyTorch, unseen by any backend)."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.allow_rnn = True
