# SPDX-License-Identifier: Apache-2.0
"""Export small models of public architectures to ONNX, as a user's pipeline would, for check_model.

    python scripts/export_models.py OUT_DIR            # every model
    python scripts/export_models.py OUT_DIR --only unet-ort-nhwc llama-ort

Needs torch, torchvision, diffusers, transformers, onnx, onnxruntime and onnxscript (none of them is a
dependency of the kernels or of the tests): the files this writes are committed under
`tests/data/models/`, and the tests run `check_model` on them.

The architectures are the real ones (diffusers' UNet2DConditionModel and AutoencoderKL decoder,
torchvision's ResNet, the fast-neural-style TransformerNet, transformers' BERT and Llama) at small
configurations with random weights, so that the files stay small; the normalization nodes they hold
are the ones the full-size exports hold:

| file | exporter | normalization nodes |
| --- | --- | --- |
| unet-legacy | torch.onnx legacy, opset 17 | InstanceNormalization (group norm as Reshape, InstanceNorm, Reshape), LayerNormalization |
| unet-dynamo | torch.onnx dynamo, opset 21 | GroupNormalization-21, LayerNormalization |
| unet-ort-nhwc, unet-ort-nchw | legacy, then ONNX Runtime's optimizer (`model_type="unet"`) | com.microsoft GroupNorm, SkipGroupNorm (channels-last or not), LayerNormalization, SkipLayerNormalization |
| vae-decoder-ort | legacy, then the optimizer (`model_type="vae"`) | com.microsoft GroupNorm, SkipGroupNorm |
| resnet | legacy, opset 17, BatchNormalization kept (`training=PRESERVE`) | BatchNormalization |
| style-net | legacy, opset 17 | InstanceNormalization |
| bert-ort | legacy, then the optimizer (`model_type="bert"`) | LayerNormalization, SkipLayerNormalization |
| llama-ort | legacy, then the optimizer (`model_type="gpt2"`) | SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization |
| llama-opset23 | dynamo, opset 23 | RMSNormalization |

Each ONNX Runtime-optimized model is also written in float16 (`-fp16`), converted the way ONNX
Runtime's Stable Diffusion pipeline does (`convert_float_to_float16(keep_io_types=False)`).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

SEED = 0
OPSET = 17


def _patch_onnxruntime_optimizer():
    """ONNX Runtime's UNet attention fusion converts a one-element array with int(), which numpy 2.4
    refuses; take the element instead (the same number)."""
    from onnxruntime.transformers import fusion_attention_unet

    def get_num_heads(self, reshape_q, is_torch2=False):
        if is_torch2:
            parent = self.model.get_parent(reshape_q, 1)
            if parent is None or parent.op_type != "Concat" or len(parent.input) != 4:
                return 0
            value = self.model.get_constant_value(parent.input[2])
        else:
            shape = self.model.get_constant_value(reshape_q.input[1])
            if not isinstance(shape, np.ndarray) or list(shape.shape) != [4]:
                return 0
            value = shape[2]
        heads = int(np.asarray(value).reshape(-1)[0]) if value is not None else 0
        return heads if heads > 0 else 0

    fusion_attention_unet.FusionAttentionUnet.get_num_heads = get_num_heads


def _legacy_export(module, args, path, names, opset=OPSET, preserve_training_ops=False):
    module.eval()
    training = torch.onnx.TrainingMode.PRESERVE if preserve_training_ops else torch.onnx.TrainingMode.EVAL
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=names,
            opset_version=opset,
            dynamo=False,
            training=training,
            do_constant_folding=not preserve_training_ops,
        )


def _dynamo_export(module, args, path, names, opset):
    module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, args, input_names=names, opset_version=opset, dynamo=True)
        program.save(str(path))


def _ort_optimized(source, target, model_type, *, channels_last=True, float16=False):
    """What ONNX Runtime's Stable Diffusion and transformer pipelines do to an export."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions(model_type)
    if model_type in ("unet", "vae"):
        options.enable_group_norm = True
        options.enable_skip_group_norm = True
        options.group_norm_channels_last = channels_last
        options.enable_bias_add = False  # keeps BiasAdd (a contrib op without a CPU kernel) out
    optimized = optimize_model(
        str(source),
        model_type=model_type,
        num_heads=0,
        hidden_size=0,
        opt_level=0,
        optimization_options=options,
    )
    if float16:
        optimized.convert_float_to_float16(keep_io_types=False)
    optimized.save_model_to_file(str(target))


class _UnetForExport(torch.nn.Module):
    """The UNet's forward as plain tensors in, one tensor out (diffusers returns a dataclass)."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states):
        return self.unet(sample, timestep, encoder_hidden_states, return_dict=False)[0]


def _unet():
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    args = (torch.randn(1, 4, 8, 8), torch.tensor([10.0]), torch.randn(1, 6, 16))
    return _UnetForExport(unet), args, ["sample", "timestep", "encoder_hidden_states"]


class _DecoderForExport(torch.nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, latent):
        return self.vae.decode(latent, return_dict=False)[0]


def _vae_decoder():
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(16, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=16,
    )
    return _DecoderForExport(vae), (torch.randn(1, 4, 8, 8),), ["latent"]


def _resnet():
    """ResNet-18's stem and first stage (the later stages only add width: 11 M parameters in all)."""
    from torchvision.models import resnet18

    full = resnet18()
    stem_and_layer1 = torch.nn.Sequential(full.conv1, full.bn1, full.relu, full.maxpool, full.layer1)
    return stem_and_layer1, (torch.randn(1, 3, 32, 32),), ["image"]


class _StyleNet(torch.nn.Module):
    """The fast-neural-style TransformerNet (Johnson et al.; pytorch/examples), at a quarter width."""

    def __init__(self, width=8):
        super().__init__()

        def conv(cin, cout, kernel, stride=1, upsample=None):
            layers = [torch.nn.Upsample(scale_factor=upsample, mode="nearest")] if upsample else []
            layers += [torch.nn.ReflectionPad2d(kernel // 2), torch.nn.Conv2d(cin, cout, kernel, stride)]
            return torch.nn.Sequential(*layers)

        def norm(channels):
            return torch.nn.InstanceNorm2d(channels, affine=True)

        w = width
        self.down = torch.nn.Sequential(
            conv(3, w, 9), norm(w), torch.nn.ReLU(),
            conv(w, 2 * w, 3, 2), norm(2 * w), torch.nn.ReLU(),
            conv(2 * w, 4 * w, 3, 2), norm(4 * w), torch.nn.ReLU(),
        )  # fmt: skip
        self.residual = torch.nn.ModuleList(
            torch.nn.Sequential(
                conv(4 * w, 4 * w, 3), norm(4 * w), torch.nn.ReLU(), conv(4 * w, 4 * w, 3), norm(4 * w)
            )
            for _ in range(2)
        )
        self.up = torch.nn.Sequential(
            conv(4 * w, 2 * w, 3, upsample=2), norm(2 * w), torch.nn.ReLU(),
            conv(2 * w, w, 3, upsample=2), norm(w), torch.nn.ReLU(),
            conv(w, 3, 9),
        )  # fmt: skip

    def forward(self, image):
        x = self.down(image)
        for block in self.residual:
            x = x + block(x)
        return self.up(x)


def _style_net():
    return _StyleNet(), (torch.randn(1, 3, 32, 32),), ["image"]


class _LastHidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


def _bert():
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    ids = torch.randint(0, 64, (1, 8))
    return _LastHidden(BertModel(config)), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]


def _llama():
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    ids = torch.randint(0, 64, (1, 8))
    return _LastHidden(LlamaModel(config)), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]


def _export_unet_family(out: Path, only):
    model, args, names = _unet()
    legacy = out / "unet-legacy.onnx"
    _legacy_export(model, args, legacy, names)
    if "unet-dynamo" in only:
        _dynamo_export(model, args, out / "unet-dynamo.onnx", names, opset=21)
    for layout, channels_last in (("nhwc", True), ("nchw", False)):
        name = f"unet-ort-{layout}"
        if name in only:
            _ort_optimized(legacy, out / f"{name}.onnx", "unet", channels_last=channels_last)
            _ort_optimized(
                legacy, out / f"{name}-fp16.onnx", "unet", channels_last=channels_last, float16=True
            )


def _export_vae(out: Path, only):
    model, args, names = _vae_decoder()
    legacy = out / "vae-decoder-legacy.onnx"
    _legacy_export(model, args, legacy, names)
    _ort_optimized(legacy, out / "vae-decoder-ort.onnx", "vae")
    _ort_optimized(legacy, out / "vae-decoder-ort-fp16.onnx", "vae", float16=True)
    legacy.unlink()


def _export_transformer(out: Path, name: str, build, model_type: str):
    model, args, names = build()
    legacy = out / f"{name}-legacy.onnx"
    _legacy_export(model, args, legacy, names)
    _ort_optimized(legacy, out / f"{name}-ort.onnx", model_type)
    _ort_optimized(legacy, out / f"{name}-ort-fp16.onnx", model_type, float16=True)
    legacy.unlink()


EXPORTS = {
    "unet-legacy": lambda out, only: _export_unet_family(out, only),
    "vae-decoder-ort": _export_vae,
    "resnet": lambda out, only: _legacy_export(
        *_resnet()[:2], out / "resnet.onnx", ["image"], preserve_training_ops=True
    ),
    "style-net": lambda out, only: _legacy_export(*_style_net()[:2], out / "style-net.onnx", ["image"]),
    "bert-ort": lambda out, only: _export_transformer(out, "bert", _bert, "bert"),
    "llama-ort": lambda out, only: _export_transformer(out, "llama", _llama, "gpt2"),
    "llama-opset23": lambda out, only: _dynamo_export(
        *_llama()[:2], out / "llama-opset23.onnx", ["input_ids", "attention_mask"], opset=23
    ),
}
UNET_FILES = ("unet-dynamo", "unet-ort-nhwc", "unet-ort-nchw")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder the .onnx files go to")
    parser.add_argument(
        "--only", nargs="+", choices=sorted(EXPORTS) + list(UNET_FILES), help="export these only"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    only = set(args.only or [*EXPORTS, *UNET_FILES])
    if only & set(UNET_FILES):
        only.add("unet-legacy")
    _patch_onnxruntime_optimizer()
    for name, export in EXPORTS.items():
        if name in only:
            torch.manual_seed(SEED)
            print(f"exporting {name}", flush=True)
            export(args.out, only)
    for path in sorted(args.out.glob("*.onnx")):
        model = onnx.load(str(path))
        kinds = sorted({n.op_type for n in model.graph.node if "Norm" in n.op_type})
        print(f"{path.name}: {path.stat().st_size / 1e6:.2f} MB, {', '.join(kinds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
