"""What a train batch costs to move to the device: float32 [-1, 1] (what the input pipeline hands the
step today) against uint8 pixels normalised on the device.

  python benchmarks/host_to_device.py [--batch=256] [--image_size=224] [--repeats=20]

Per dtype: milliseconds per `jax.device_put` of one batch (to the first device, waited on) and the
rate in GB/s; for uint8 also the jitted normalisation to bfloat16 on the device. The last line gives
uint8's time (copy + normalisation) over float32's copy.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np


def _seconds_per_call(fn, repeats: int) -> float:
  for _ in range(3):  # Warm-up: allocations, compilation.
    jax.block_until_ready(fn())
  start = time.perf_counter()
  for _ in range(repeats):
    jax.block_until_ready(fn())
  return (time.perf_counter() - start) / repeats


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--batch', type=int, default=256)
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--repeats', type=int, default=20)
  args = parser.parse_args()
  device = jax.devices()[0]
  pixels = np.random.default_rng(0).integers(
      0, 256, (args.batch, args.image_size, args.image_size, 3), dtype=np.uint8
  )
  batches = {
      'float32': pixels.astype(np.float32) / np.float32(127.5) - np.float32(1),
      'uint8': pixels,
  }
  print(f'device: {device.device_kind}; batch {args.batch} x {args.image_size}^2 x 3')
  print('| batch dtype | MB | device_put ms | GB/s |')
  print('|---|---|---|---|')
  copy = {}
  for name, batch in batches.items():
    copy[name] = _seconds_per_call(lambda batch=batch: jax.device_put(batch, device), args.repeats)
    print(
        f'| {name} | {batch.nbytes / 1e6:.1f} | {copy[name] * 1e3:.2f} | '
        f'{batch.nbytes / copy[name] / 1e9:.1f} |'
    )
  normalize = jax.jit(lambda x: x.astype(jnp.bfloat16) / jnp.bfloat16(127.5) - jnp.bfloat16(1))
  on_device = jax.device_put(pixels, device)
  normalized = _seconds_per_call(lambda: normalize(on_device), args.repeats)
  print(f'uint8 normalised to bfloat16 on the device: {normalized * 1e3:.2f} ms')
  print(
      f'uint8 (copy + normalise) / float32 (copy): {(copy["uint8"] + normalized) / copy["float32"]:.2f}x'
  )


if __name__ == '__main__':
  main()
