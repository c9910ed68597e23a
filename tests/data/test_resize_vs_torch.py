"""The antialiased resize against torchvision's: the comparisons of test_resize.py with the torch-
based peers, which `make test-all` runs (they need the test extra)."""

import numpy as np
from PIL import Image
import pytest
import torch
from torchvision import transforms

from vit_jax.data import crops
from test_resize import _image


# Longer sides of 341.3, 79.5, 42.7 and 187.5, each rounded down; offsets of 58.5 and 2.5 rounded to
# even (down), 15.5 (up).
@pytest.mark.parametrize(
    'height,width,size,crop_fraction',
    [
        (375, 500, 224, 0.875),
        (500, 375, 224, 0.875),
        (20, 30, 48, 0.9),
        (375, 500, 224, 0.9),  # 248.9: timm's int(size / crop_pct) is 248.
        (40, 30, 16, 0.5),
        (160, 240, 125, 1.0),
        (50, 50, 24, 1.0),
    ],
)
def test_antialiased_central_crop_is_torchvisions_resize_and_center_crop(
    height, width, size, crop_fraction
):
  """timm's eval transform on the decoded PIL image: Resize(shorter side) + CenterCrop, bilinear."""
  image = _image(height, width)
  reference = transforms.Compose(
      [
          transforms.Resize(int(size / crop_fraction), transforms.InterpolationMode.BILINEAR),
          transforms.CenterCrop(size),
      ]
  )
  expected = np.asarray(reference(Image.fromarray(image)), np.float32)
  got = crops.central_crop(image, size, crop_fraction, antialias=True)
  assert got.shape == (size, size, 3)
  np.testing.assert_array_equal(got, expected)
  # torchvision on tensors (antialiased, in float) agrees within a level: its resize does not round.
  tensor = transforms.functional.resize(
      torch.from_numpy(image).permute(2, 0, 1).float(), int(size / crop_fraction), antialias=True
  )
  tensor = transforms.functional.center_crop(tensor, size).permute(1, 2, 0).numpy()
  np.testing.assert_allclose(got, tensor, atol=1.5)
