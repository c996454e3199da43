"""One model of each family on-device learning is for, trained by an unchanged seeded train()
loop (SGD with momentum, a few steps) under torch.compile(backend="edgetrain"): the losses equal
eager PyTorch's in float64 (dropout masks drawn as eager draws them, batch norm in training
mode, the loss computed by torch on the compiled model's output)."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import tests.realmodels.conftest  # noqa: F401  (lets transformers import beside CPU torch)
from edgetrain.torch_backend import last_programs

#: float64 losses of the same seeded loop differ by rounding only (edgetrain's kernels sum in
#: another order than torch's)
LOSS_RTOL = 1e-10
#: a model that computes parts in float32 by design (Llama's RMSNorm and rotary tables cast to
#: float32 whatever the model's dtype): their float32 rounding (2**-24 relative) reaches the loss
FLOAT32_PARTS_RTOL = 1e-7
STEPS = 3
LR = 0.05


def _newest():
    """The graph edgetrain compiled last (None before any): last_programs() keeps only the
    newest few, so a count does not show that a new one came."""
    progs = last_programs()
    return progs[-1] if progs else None


def _loop(model, fn, batches, loss_fn, seed=3):
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = loss_fn(fn(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _check(model, batches, loss_fn=F.cross_entropy, rtol=LOSS_RTOL):
    """Eager's and edgetrain's losses over the same seeded loop; edgetrain compiled a graph."""
    model = model.double().train()
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    before = _newest()
    ours = _loop(model, torch.compile(model, backend="edgetrain"), batches, loss_fn)
    theirs = _loop(eager, eager, batches, loss_fn)
    assert _newest() is not before, "no graph reached edgetrain"
    assert all(abs(a - b) <= rtol * abs(b) for a, b in zip(ours, theirs)), (ours, theirs)
    assert theirs[0] != theirs[-1]  # the loop trained


def _data(shape, labels, steps=STEPS):
    return [(torch.randn(*shape, generator=torch.Generator().manual_seed(k), dtype=torch.float64),
             labels(k)) for k in range(steps)]


def _classes(n, classes):
    return lambda k: torch.tensor([(k + i) % classes for i in range(n)])


# --- keyword spotting: a 1-D CNN over MFCC-like frames ----------------------------------------
class KeywordSpotter(nn.Module):
    def __init__(self, mfcc=10, classes=4):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(mfcc, 16, 3, padding=1), nn.BatchNorm1d(16), nn.ReLU(),
                                  nn.Conv1d(16, 16, 3, stride=2), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2))
        self.fc = nn.Linear(16, classes)

    def forward(self, x):  # (N, MFCC coefficients, frames)
        return self.fc(self.body(x).mean(2))


def test_keyword_spotter_conv1d():
    torch.manual_seed(0)
    _check(KeywordSpotter(), _data((3, 10, 12), _classes(3, 4)))


# --- sensor classification: a GRU over IMU readings ---------------------------------------------
class SensorGRU(nn.Module):
    def __init__(self, channels=6, hidden=8, classes=3):
        super().__init__()
        self.gru = nn.GRU(channels, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):  # (N, time, sensor channels)
        return self.fc(self.gru(x)[1][-1])


def test_gru_sensor_classifier():
    torch.manual_seed(0)
    _check(SensorGRU(), _data((2, 6, 6), _classes(2, 3)))


class StackedLSTM(nn.Module):
    def __init__(self, channels=4, hidden=6, classes=3):
        super().__init__()
        self.lstm = nn.LSTM(channels, hidden, num_layers=2, dropout=0.3, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc(self.lstm(x)[0][:, -1])


def test_lstm_two_layers_with_dropout():
    torch.manual_seed(0)
    _check(StackedLSTM(), _data((2, 5, 4), _classes(2, 3)))


# --- anomaly detection: a convolutional autoencoder ---------------------------------------------
class ConvAutoencoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encode = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(),
                                    nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU())
        self.decode = nn.Sequential(nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
                                    nn.ConvTranspose2d(4, 1, 3, stride=2, padding=1, output_padding=1))

    def forward(self, x):
        return self.decode(self.encode(x))


def test_conv_autoencoder_mse():
    torch.manual_seed(0)
    batches = [(x, x) for x, _ in _data((2, 1, 8, 8), lambda k: None)]
    _check(ConvAutoencoder(), batches, F.mse_loss)


# --- segmentation: a small UNet --------------------------------------------------------------------
class TinyUNet(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
        self.down2 = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(4, 8, 3, padding=1), nn.ReLU())
        self.bottom = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.up_bilinear = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.up_nearest = nn.Upsample(scale_factor=2, mode="nearest")
        self.merge2 = nn.Sequential(nn.Conv2d(16, 4, 3, padding=1), nn.ReLU())
        self.merge1 = nn.Conv2d(8, classes, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(d1)
        u2 = self.merge2(torch.cat([self.up_bilinear(self.bottom(d2)), d2], 1))
        return self.merge1(torch.cat([self.up_nearest(u2), d1], 1))


def test_unet_segmenter_per_pixel_cross_entropy():
    torch.manual_seed(0)
    masks = lambda k: torch.randint(0, 3, (2, 8, 8), generator=torch.Generator().manual_seed(100 + k))  # noqa: E731
    _check(TinyUNet(), _data((2, 3, 8, 8), masks))


# --- sequence classification: a TransformerEncoder with dropout ----------------------------------
class EncoderClassifier(nn.Module):
    def __init__(self, features=8, width=16, classes=4):
        super().__init__()
        self.embed = nn.Linear(features, width)
        layer = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.2, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        return self.fc(self.encoder(self.embed(x)).mean(1))


def test_transformer_encoder_classifier_with_dropout():
    torch.manual_seed(0)
    _check(EncoderClassifier(), _data((3, 5, 8), _classes(3, 4)))


# --- language modelling: a tiny Llama-style decoder (rotary embeddings) --------------------------
VOCAB, SEQ = 100, 6


class TinyLlama(nn.Module):
    """transformers' LlamaForCausalLM (hidden 32, 2 layers, 2 heads), its logits flattened for a
    next-token cross entropy."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2 * SEQ,
                          attn_implementation="eager", use_cache=False)
        self.lm = LlamaForCausalLM(cfg)

    def forward(self, ids):
        return self.lm(input_ids=ids).logits.reshape(-1, VOCAB)


def test_tiny_llama_decoder_rotary_embeddings():
    torch.manual_seed(0)
    batches = []
    for k in range(STEPS):
        ids = torch.randint(0, VOCAB, (2, SEQ + 1), generator=torch.Generator().manual_seed(k))
        batches.append((ids[:, :-1], ids[:, 1:].reshape(-1)))
    _check(TinyLlama(), batches, rtol=FLOAT32_PARTS_RTOL)


# --- GroupNorm and ELU / LeakyReLU CNNs --------------------------------------------------------------
class GroupNormCNN(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ELU(),
                                  nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.GroupNorm(4, 8), nn.LeakyReLU(0.1))
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


def test_group_norm_elu_leaky_relu_cnn():
    torch.manual_seed(0)
    _check(GroupNormCNN(), _data((2, 3, 6, 6), _classes(2, 4)))


# --- stochastic depth as timm and transformers write it (floor of keep_prob + rand) -------------------
class DropPathMLP(nn.Module):
    """Residual blocks whose branch is dropped per sample: keep = floor(keep_prob + rand), the
    drop path of timm, Segformer, ConvNeXt, Swin (an in-place floor_ on a fresh random tensor)"""

    def __init__(self, keep_prob=0.6, classes=4):
        super().__init__()
        self.keep_prob = keep_prob
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        for block in self.blocks:
            keep = self.keep_prob + torch.rand((x.shape[0], 1), dtype=x.dtype)
            keep.floor_()
            x = x + torch.tanh(block(x)) / self.keep_prob * keep
        return self.fc(x)


def test_drop_path_floor_of_random():
    torch.manual_seed(0)
    _check(DropPathMLP(), _data((4, 8), _classes(4, 4)))
