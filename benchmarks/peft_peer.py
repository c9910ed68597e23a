"""Hugging Face peft's LoRA as train_step.py's peer for our low-rank adapters (`--lora_rank`): a
transformers ViTForImageClassification of our model's shape (separate query, key and value
projections, as ours), LoRA of the same rank, alpha, dropout and layers, the head trained
(modules_to_save), as peft's users fine-tune a ViT; forward, backward, clipping and AdamW of the
trained parameters in PyTorch.
"""

from typing import Any

import ml_collections

import step_harness
import timm_peer

# Our lora_targets -> the layers of a transformers ViT layer (transformers 5's names).
MODULES = {
    'query': ('attention.q_proj',),
    'key': ('attention.k_proj',),
    'value': ('attention.v_proj',),
    'out': ('attention.o_proj',),
    'mlp_in': ('mlp.fc1',),
    'mlp_out': ('mlp.fc2',),
}


class PeftVit(timm_peer.Timm):
  """peft's LoRA on transformers' ViT, stepped, waited for and measured as `Timm` (its optimizer
  over the parameters peft trains)."""

  def network(self, model: dict[str, Any], config: ml_collections.ConfigDict) -> Any:
    import peft  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top

    vit = transformers.ViTForImageClassification(
        transformers.ViTConfig(
            image_size=config.image_size,
            patch_size=model['patch_size'],
            hidden_size=model['hidden_size'],
            num_hidden_layers=model['num_layers'],
            num_attention_heads=model['num_heads'],
            intermediate_size=model['mlp_dim'],
            num_labels=step_harness.NUM_CLASSES,
            hidden_act='gelu_pytorch_tanh',  # Ours is the tanh GELU.
            layer_norm_eps=model['layernorm_epsilon'],
        )
    )
    layers = '|'.join(m.replace('.', r'\.') for t in model['lora_targets'] for m in MODULES[t])
    return peft.get_peft_model(
        vit,
        peft.LoraConfig(
            r=model['lora_rank'],
            lora_alpha=model['lora_alpha'] or model['lora_rank'],
            lora_dropout=model['lora_dropout'],
            target_modules=rf'.*\.layers\.\d+\.({layers})',
            modules_to_save=['classifier'],
        ),
    )

  def logits(self, images: Any) -> Any:
    return self.net(pixel_values=images).logits
