"""Real models people use (torchvision, timm, Hugging Face transformers) at small configs:
images 64x64 at batch 2, 16 tokens, hidden sizes about 32.

torchvision here is a CUDA build whose compiled ops cannot load beside CPU torch; its Python
registers fake kernels for `torchvision::nms` / `qnms` at import, which fails unless those op
schemas exist. Defining the two schemas first (no kernel: nothing here calls them) lets
`import torchvision` (and transformers, which imports it) succeed.
"""
from __future__ import annotations

import warnings

import pytest
import torch

IMAGE = (2, 3, 64, 64)
TOKENS = (2, 16)
VOCAB = 1000
NUM_CLASSES = 10


def _define_torchvision_schemas():
    for name in ("nms", "qnms"):
        try:
            torch.library.define(f"torchvision::{name}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:  # already defined (by a working torchvision, or an earlier import)
            pass


_define_torchvision_schemas()
warnings.filterwarnings("ignore", message=".*(LeafSpec|token_id).*")


class Logits(torch.nn.Module):
    """A Hugging Face model returning its logits tensor (the last position's, for a language
    model: a classifier over the vocabulary)."""

    def __init__(self, model: torch.nn.Module, last: bool = False):
        super().__init__()
        self.m, self.last = model, last

    def forward(self, x):
        out = self.m(x)
        out = out.logits if hasattr(out, "logits") else out
        return out[:, -1] if self.last else out


def torchvision_model(name: str, **kw):
    import torchvision.models as tvm

    return getattr(tvm, name)(num_classes=NUM_CLASSES, **kw)


def timm_model(name: str, **kw):
    import timm

    return timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES, **kw)


SMALL_BERT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=64, num_labels=NUM_CLASSES)


SMALL_GPT2 = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0)
SMALL_VIT = dict(image_size=64, patch_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, num_labels=NUM_CLASSES)


def hf_model(cls: str, config: str, last: bool = False, attn_implementation: str = None, **kw):
    import transformers

    cfg = getattr(transformers, config)(**kw)
    if attn_implementation is not None:
        cfg._attn_implementation = attn_implementation
    return Logits(getattr(transformers, cls)(cfg), last)


#: name -> (builder, input kind): the models of issue 17's list; the builders take no argument
#: and seed nothing
BUILDERS = {
    # torchvision
    "tv.squeezenet1_1": (lambda: torchvision_model("squeezenet1_1"), "image"),
    "tv.shufflenet_v2_x0_5": (lambda: torchvision_model("shufflenet_v2_x0_5"), "image"),
    "tv.mnasnet0_5": (lambda: torchvision_model("mnasnet0_5"), "image"),
    "tv.mobilenet_v2": (lambda: torchvision_model("mobilenet_v2"), "image"),
    "tv.mobilenet_v3_small": (lambda: torchvision_model("mobilenet_v3_small"), "image"),
    "tv.mobilenet_v3_large": (lambda: torchvision_model("mobilenet_v3_large"), "image"),
    "tv.resnet18": (lambda: torchvision_model("resnet18"), "image"),
    "tv.regnet_x_400mf": (lambda: torchvision_model("regnet_x_400mf"), "image"),
    "tv.efficientnet_b0": (lambda: torchvision_model("efficientnet_b0"), "image"),
    "tv.googlenet": (lambda: torchvision_model("googlenet", aux_logits=False, init_weights=True), "image"),
    "tv.resnet50": (lambda: torchvision_model("resnet50"), "image"),
    "tv.densenet121": (lambda: torchvision_model("densenet121"), "image"),
    "tv.vit_b_16": (lambda: torchvision_model("vit_b_16", image_size=64), "image"),
    "tv.convnext_tiny": (lambda: torchvision_model("convnext_tiny"), "image"),
    "tv.swin_t": (lambda: torchvision_model("swin_t"), "image"),
    # timm
    "timm.mobilenetv3_small_050": (lambda: timm_model("mobilenetv3_small_050"), "image"),
    "timm.resnet10t": (lambda: timm_model("resnet10t"), "image"),
    "timm.ghostnet_050": (lambda: timm_model("ghostnet_050"), "image"),
    "timm.efficientnet_lite0": (lambda: timm_model("efficientnet_lite0"), "image"),
    "timm.vit_tiny_patch16_224": (lambda: timm_model("vit_tiny_patch16_224", img_size=64), "image"),
    "timm.levit_128s": (lambda: timm_model("levit_128s", img_size=64), "image"),
    "timm.edgenext_xx_small": (lambda: timm_model("edgenext_xx_small"), "image"),
    "timm.efficientvit_b0": (lambda: timm_model("efficientvit_b0"), "image"),
    "timm.fastvit_t8": (lambda: timm_model("fastvit_t8"), "image"),
    "timm.mobilevit_xxs": (lambda: timm_model("mobilevit_xxs"), "image"),
    # transformers, small configs
    "hf.bert": (lambda: hf_model("BertForSequenceClassification", "BertConfig", **SMALL_BERT), "tokens"),
    "hf.distilbert": (lambda: hf_model("DistilBertForSequenceClassification", "DistilBertConfig", vocab_size=VOCAB,
                                       dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64,
                                       num_labels=NUM_CLASSES), "tokens"),
    "hf.mobilebert": (lambda: hf_model("MobileBertForSequenceClassification", "MobileBertConfig", vocab_size=VOCAB,
                                       hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, intra_bottleneck_size=16, true_hidden_size=16,
                                       max_position_embeddings=64, num_labels=NUM_CLASSES), "tokens"),
    "hf.gpt2lm": (lambda: hf_model("GPT2LMHeadModel", "GPT2Config", last=True, **SMALL_GPT2), "tokens"),
    "hf.gpt2cls": (lambda: hf_model("GPT2ForSequenceClassification", "GPT2Config", pad_token_id=0,
                                    num_labels=NUM_CLASSES, **SMALL_GPT2), "tokens"),
    "hf.vit": (lambda: hf_model("ViTForImageClassification", "ViTConfig", **SMALL_VIT), "image"),
    "hf.vit_eager": (lambda: hf_model("ViTForImageClassification", "ViTConfig", attn_implementation="eager",
                                      **SMALL_VIT), "image"),
}


def build(name: str):
    """(model in float64 and eval mode, example input, labels), the same on every call."""
    make, kind = BUILDERS[name]
    torch.manual_seed(0)
    model = make().double().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*IMAGE, generator=g, dtype=torch.float64) if kind == "image" else \
        torch.randint(1, VOCAB, TOKENS, generator=g)
    with torch.no_grad():
        classes = model(x).shape[-1]
    y = torch.randint(0, classes, (x.shape[0],), generator=g)
    return model, x, y


@pytest.fixture(autouse=True, scope="package")
def _one_intra_op_thread():
    """These tests share 2 cores with others; torch's second thread gains nothing here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
