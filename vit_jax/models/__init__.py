from vit_jax.models.vit import VisionTransformer
