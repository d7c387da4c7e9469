"""DiT size presets: one registry, the CLI's and the config's choices come from it.

Shapes follow Peebles & Xie 2023 (facebookresearch/DiT, Table 1): heads x head_dim = hidden size.
Image size, channels and class count come from the dataset, not the preset.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DiTPreset:
    num_layers: int  # transformer blocks
    num_attention_heads: int
    attention_head_dim: int  # hidden size = heads * head_dim
    patch_size: int  # image is cut into patch_size x patch_size tokens


PRESETS: dict[str, DiTPreset] = {
    # 8x8 digits -> 16 tokens of width 64: several optimizer steps/s on a 2-core CPU; used by tests and demo.
    "tiny": DiTPreset(num_layers=2, num_attention_heads=2, attention_head_dim=32, patch_size=2),
    "DiT-S/2": DiTPreset(num_layers=12, num_attention_heads=6, attention_head_dim=64, patch_size=2),
    "DiT-B/2": DiTPreset(num_layers=12, num_attention_heads=12, attention_head_dim=64, patch_size=2),
    "DiT-L/2": DiTPreset(num_layers=24, num_attention_heads=16, attention_head_dim=64, patch_size=2),
    "DiT-XL/2": DiTPreset(num_layers=28, num_attention_heads=16, attention_head_dim=72, patch_size=2),
}


def build_dit(preset: str, *, sample_size: int, in_channels: int, num_classes: int):
    """A class-conditional diffusers ``DiTTransformer2DModel`` predicting epsilon (no learned sigma).

    diffusers draws classifier-free label dropout from the *global* torch RNG inside every block's label
    embedding, which would make the update depend on how a batch is split. We keep the null-class row of the
    embedding tables but switch that internal dropout off; the trial drops labels itself from per-example keyed
    generators (see `trainables.randomness`).
    """
    from diffusers import DiTTransformer2DModel
    from diffusers.models.embeddings import LabelEmbedding

    p = PRESETS[preset]
    model = DiTTransformer2DModel(
        num_attention_heads=p.num_attention_heads,
        attention_head_dim=p.attention_head_dim,
        in_channels=in_channels,
        out_channels=in_channels,  # epsilon only
        num_layers=p.num_layers,
        sample_size=sample_size,
        patch_size=p.patch_size,
        num_embeds_ada_norm=num_classes,  # = number of classes (+1 null row for CFG dropout)
        norm_type="ada_norm_zero",
    )
    for module in model.modules():
        if isinstance(module, LabelEmbedding):
            module.dropout_prob = 0.0  # the table still has the null row (index num_classes)
    return model
