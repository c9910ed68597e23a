"""vit_jax: pretrain, fine-tune, evaluate and export Vision Transformers with JAX and Flax."""
