"""The model families on-device learning is for (issue 31), at small configs: keyword spotting
on MFCCs and on raw audio, IMU sensor classifiers (GRU, LSTM), segmentation (a tiny UNet,
torchvision's and transformers' segmenters), autoencoders, video, a language model with LoRA
(peft), GroupNorm/InstanceNorm and ELU/LeakyReLU/PReLU/Mish networks, and transformers' speech
encoders and BART.

`FAMILIES` mirrors tests/realmodels/conftest.py's `BUILDERS`: name -> Family(builder, input,
loss), the builders take no argument and seed nothing; `build(name)` gives the float64
eval-mode model, its example input and labels, the same on every call.

A segmenter's per-pixel logits (N, classes, H, W) are averaged over the pixels (`PixelMean`) so
that every model here trains with the loss it names on (N, classes) logits: what is under test
is the backbone's ops (up-sampling, transposed convolution, concatenation), not a per-pixel loss.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

# the torchvision op-schema workaround runs at this import, before anything imports
# torchvision (transformers and peft import it)
from . import conftest as rm

NUM_CLASSES = rm.NUM_CLASSES
VOCAB = rm.VOCAB
BATCH = 2
#: a keyword spotter's input: 49 frames (1 s at a 20 ms stride) x 10 MFCCs, as the DS-CNN
#: of "Hello Edge" (Zhang et al. 2017) takes it
MFCC = (BATCH, 1, 49, 10)
#: a 12-word keyword vocabulary (Speech Commands' 10 words + silence + unknown)
KEYWORDS = 12
#: raw audio: 0.1 s at 8 kHz, long enough for three strided/dilated convolutions
RAW_AUDIO = (BATCH, 1, 800)
#: transformers' speech encoders: 0.025 s at 16 kHz through a two-layer feature extractor
SPEECH = (BATCH, 400)
#: IMU windows: 20 time steps of a 3-axis accelerometer + 3-axis gyroscope
IMU = (BATCH, 20, 6)
#: six activities (walking, upstairs, downstairs, sitting, standing, lying: UCI HAR)
ACTIVITIES = 6
#: a tiny segmentation image (two 2x down-samplings leave 8x8)
SEG_IMAGE = (BATCH, 3, 32, 32)
#: flattened 8x8 images for the fully connected autoencoder, 16x16 for the conv one
AE_FLAT = (BATCH, 64)
AE_IMAGE = (BATCH, 1, 16, 16)
#: a video clip: 3 colours x 8 frames x 16 x 16 (torchvision's r3d/mc3 take 4 frames of 32x32)
CLIP = (BATCH, 3, 8, 16, 16)
TV_CLIP = (BATCH, 3, 4, 32, 32)
#: BART's end-of-sequence token: its classifier reads the hidden state at the last one
BART_EOS = 2
#: LoRA's rank and scale on GPT-2's attention projection (small, as for an MCU's flash)
LORA_RANK, LORA_ALPHA = 4, 8


@dataclass(frozen=True)
class Family:
    make: Callable[[], nn.Module]
    #: the example input from a seeded generator
    input: Callable[[torch.Generator], torch.Tensor]
    #: "cross_entropy" over (N, classes) logits, or "mse" against the input (autoencoders)
    loss: str = "cross_entropy"


def randn(*shape):
    return lambda g: torch.randn(*shape, generator=g, dtype=torch.float64)


def tokens(g: torch.Generator) -> torch.Tensor:
    return torch.randint(1, VOCAB, rm.TOKENS, generator=g)


def bart_tokens(g: torch.Generator) -> torch.Tensor:
    """Tokens above BART's specials (pad 1, eos 2), each sequence ending in one eos."""
    t = torch.randint(BART_EOS + 1, VOCAB, rm.TOKENS, generator=g)
    t[:, -1] = BART_EOS
    return t


class PixelMean(nn.Module):
    """(N, classes, H, W) per-pixel logits (or a dict / model output holding them) -> (N, classes)."""

    def __init__(self, model: nn.Module, key: str = None):
        super().__init__()
        self.m, self.key = model, key

    def forward(self, x):
        out = self.m(x)
        out = out[self.key] if self.key is not None else getattr(out, "logits", out)
        return out.mean(dim=tuple(range(2, out.dim())))


# ---------------------------------------------------------------- plain torch.nn, written here

def conv_bn_relu(cin, cout, k, stride=1, padding=0, groups=1):
    return [nn.Conv2d(cin, cout, k, stride, padding, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


def ds_cnn(width: int = 16, blocks: int = 2) -> nn.Module:
    """A DS-CNN keyword spotter (Hello Edge): a 10x4 strided convolution over the MFCCs, depthwise
    separable blocks, global average pooling, a classifier."""
    layers = conv_bn_relu(1, width, (10, 4), stride=(2, 2), padding=(5, 1))
    for _ in range(blocks):
        layers += conv_bn_relu(width, width, 3, padding=1, groups=width) + conv_bn_relu(width, width, 1)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, KEYWORDS))


def raw_audio_cnn() -> nn.Module:
    """A 1-D CNN on the waveform: a strided front convolution, dilated convolutions, max pooling,
    global adaptive average pooling."""
    return nn.Sequential(
        nn.Conv1d(1, 8, 9, stride=4), nn.BatchNorm1d(8), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(8, 16, 3, dilation=2), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(16, 16, 3, padding=4, dilation=4), nn.ReLU(),
        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, KEYWORDS))


class RecurrentClassifier(nn.Module):
    """A 2-layer batch-first GRU or LSTM over an IMU window; the last step's state classifies."""

    def __init__(self, cell: str, hidden: int = 16, layers: int = 2):
        super().__init__()
        self.rnn = getattr(nn, cell)(IMU[-1], hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, ACTIVITIES)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def double_conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())


class TinyUNet(nn.Module):
    """Two down-samplings (max pooling) and two up-samplings, one by a transposed convolution and
    one by bilinear interpolation, each concatenated with its skip connection; per-pixel logits."""

    def __init__(self, classes: int = NUM_CLASSES, w: int = 8):
        super().__init__()
        self.enc1, self.enc2, self.mid = double_conv(3, w), double_conv(w, 2 * w), double_conv(2 * w, 4 * w)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2)
        self.dec2 = double_conv(4 * w, 2 * w)
        self.up1 = nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                                 nn.Conv2d(2 * w, w, 1))
        self.dec1 = double_conv(2 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


def fc_autoencoder() -> nn.Module:
    n = AE_FLAT[-1]
    return nn.Sequential(nn.Linear(n, 32), nn.ReLU(), nn.Linear(32, 8), nn.ReLU(),
                         nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, n))


def conv_autoencoder() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
        nn.ConvTranspose2d(8, 1, 3, stride=2, padding=1, output_padding=1))


def video_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv3d(3, 8, 3, padding=1, bias=False), nn.BatchNorm3d(8), nn.ReLU(), nn.MaxPool3d(2),
        nn.Conv3d(8, 16, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(16, NUM_CLASSES))


def norm_cnn() -> nn.Module:
    """GroupNorm and InstanceNorm (affine and not) in place of batch norm: what small-batch
    on-device training uses, since their statistics do not depend on the batch. The convolutions
    before an instance norm have no bias: it would cancel, its gradient zero in exact arithmetic
    (float32 rounding noise on the C backend)."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.GroupNorm(4, 16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.InstanceNorm2d(16, affine=True), nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1, bias=False), nn.InstanceNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, NUM_CLASSES))


def activation_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 32), nn.ELU(), nn.Linear(32, 32), nn.LeakyReLU(0.1),
                         nn.Linear(32, 32), nn.PReLU(32), nn.Linear(32, 32), nn.Mish(),
                         nn.Linear(32, NUM_CLASSES))


def lora_gpt2() -> nn.Module:
    """A small GPT-2 language model with LoRA adapters on its attention projection (peft): only
    the adapters train. init_lora_weights=False draws B at random too (peft's default zero B
    would make A's gradient exactly zero)."""
    import peft
    import transformers

    base = transformers.GPT2LMHeadModel(transformers.GPT2Config(**rm.SMALL_GPT2))
    cfg = peft.LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=["c_attn"],
                          fan_in_fan_out=True, init_lora_weights=False)
    return rm.Logits(peft.get_peft_model(base, cfg), last=True)


# ---------------------------------------------------------------- real ones

#: transformers' speech encoders at hidden size 32: two feature-extractor convolutions (the
#: first with group norm), a small convolutional position embedding
SMALL_SPEECH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                    num_conv_pos_embedding_groups=2, classifier_proj_size=16, num_labels=NUM_CLASSES,
                    hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
                    layerdrop=0.0)
SMALL_SEGFORMER = dict(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                       patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                       decoder_hidden_size=32, num_labels=NUM_CLASSES)
SMALL_BART = dict(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                  num_labels=NUM_CLASSES, pad_token_id=1, bos_token_id=0, eos_token_id=BART_EOS)


def hf(cls: str, config: str, **kw) -> nn.Module:
    import transformers

    return getattr(transformers, cls)(getattr(transformers, config)(**kw))


class BartLastEos(nn.Module):
    """BART's sequence classifier (its encoder-decoder and classification head, unchanged) with
    its two data-dependent steps written for inputs whose one end-of-sequence token is the last
    (bart_tokens): the decoder input is the tokens shifted right behind the decoder start token,
    what `shift_tokens_right` computes (it writes into a new tensor in place: `aten.copy`), and the
    head reads the last position, what `hidden_states[eos_mask]` selects after BART's check that
    every row has as many eos tokens (`torch.unique_consecutive`, a data-dependent shape)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.m = model

    def forward(self, ids):
        start = ids.new_full((ids.shape[0], 1), self.m.config.decoder_start_token_id)
        hidden = self.m.model(input_ids=ids, decoder_input_ids=torch.cat([start, ids[:, :-1]], dim=1))
        return self.m.classification_head(hidden.last_hidden_state[:, -1])


def tv_segmenter(name: str) -> nn.Module:
    import torchvision.models.segmentation as seg

    return PixelMean(getattr(seg, name)(weights=None, weights_backbone=None, aux_loss=False,
                                        num_classes=NUM_CLASSES), key="out")


def tv_video(name: str) -> nn.Module:
    import torchvision.models.video as video

    return getattr(video, name)(num_classes=NUM_CLASSES)


FAMILIES = {
    # audio
    "audio.ds_cnn": Family(ds_cnn, randn(*MFCC)),
    "audio.raw_cnn1d": Family(raw_audio_cnn, randn(*RAW_AUDIO)),
    "audio.hf_hubert": Family(lambda: rm.Logits(hf("HubertForSequenceClassification", "HubertConfig",
                                                   **SMALL_SPEECH)), randn(*SPEECH)),
    "audio.hf_wav2vec2": Family(lambda: rm.Logits(hf("Wav2Vec2ForSequenceClassification", "Wav2Vec2Config",
                                                     **SMALL_SPEECH)), randn(*SPEECH)),
    # sensors
    "sensors.gru": Family(lambda: RecurrentClassifier("GRU"), randn(*IMU)),
    "sensors.lstm": Family(lambda: RecurrentClassifier("LSTM"), randn(*IMU)),
    # segmentation
    "seg.unet": Family(lambda: PixelMean(TinyUNet()), randn(*SEG_IMAGE)),
    "seg.hf_segformer": Family(lambda: PixelMean(hf("SegformerForSemanticSegmentation", "SegformerConfig",
                                                    **SMALL_SEGFORMER)), randn(*rm.IMAGE)),
    "seg.tv_lraspp_mobilenet_v3_large": Family(lambda: tv_segmenter("lraspp_mobilenet_v3_large"),
                                               randn(*rm.IMAGE)),
    "seg.tv_deeplabv3_mobilenet_v3_large": Family(lambda: tv_segmenter("deeplabv3_mobilenet_v3_large"),
                                                  randn(*rm.IMAGE)),
    "seg.tv_fcn_resnet50": Family(lambda: tv_segmenter("fcn_resnet50"), randn(*rm.IMAGE)),
    # autoencoders: reconstruct the input
    "ae.fc": Family(fc_autoencoder, randn(*AE_FLAT), loss="mse"),
    "ae.conv": Family(conv_autoencoder, randn(*AE_IMAGE), loss="mse"),
    # video
    "video.c3d": Family(video_cnn, randn(*CLIP)),
    "video.tv_r3d_18": Family(lambda: tv_video("r3d_18"), randn(*TV_CLIP)),
    "video.tv_mc3_18": Family(lambda: tv_video("mc3_18"), randn(*TV_CLIP)),
    # language: LoRA adapters, BART
    "lm.gpt2_lora": Family(lora_gpt2, tokens),
    "lm.hf_bart": Family(lambda: rm.Logits(hf("BartForSequenceClassification", "BartConfig", **SMALL_BART)),
                         bart_tokens),
    "lm.hf_bart_last_eos": Family(lambda: BartLastEos(hf("BartForSequenceClassification", "BartConfig",
                                                         **SMALL_BART)), bart_tokens),
    # normalisations and activations
    "norm.group_instance_cnn": Family(norm_cnn, randn(*SEG_IMAGE)),
    "norm.timm_resnet50_gn": Family(lambda: rm.timm_model("resnet50_gn"), randn(*rm.IMAGE)),
    "act.elu_prelu_mish_mlp": Family(activation_mlp, randn(BATCH, 32)),
}


def build(name: str):
    """(model in float64 and eval mode, example input, target), the same on every call: class
    labels for cross entropy, the input itself for an autoencoder's MSE."""
    fam = FAMILIES[name]
    torch.manual_seed(0)
    model = fam.make().double().eval()
    g = torch.Generator().manual_seed(1)
    x = fam.input(g)
    if fam.loss == "mse":
        return model, x, x.clone()
    with torch.no_grad():
        classes = model(x).shape[-1]
    y = torch.randint(0, classes, (x.shape[0],), generator=g)
    return model, x, y
