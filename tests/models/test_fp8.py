"""FP8 matmuls (`model.matmul='fp8'`, vit_jax/models/fp8.py) against a NumPy formula with ml_dtypes'
float8 roundings: the scales, the forward product, both gradients; the model's every block product.
"""

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import helpers
from vit_jax.models import fp8, variants

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2


def _numpy_qdq(x: np.ndarray, fp8_dtype) -> np.ndarray:
  """x through the format at the smallest power-of-two scale that fits its largest magnitude."""
  amax = float(np.max(np.abs(x)))
  if amax == 0:
    return np.zeros_like(x, np.float64)
  scale = 2.0 ** math.ceil(math.log2(amax / float(ml_dtypes.finfo(fp8_dtype).max)))
  return (x / scale).astype(fp8_dtype).astype(np.float64) * scale


def _wide_range(key, shape):
  """Normal values times magnitudes spread over 2^-6 .. 2^6: what a single scale must cover."""
  k1, k2 = jax.random.split(key)
  return np.asarray(
      jax.random.normal(k1, shape) * jnp.exp2(jax.random.uniform(k2, shape, minval=-6, maxval=6)),
      np.float32,
  )


@pytest.mark.parametrize('fp8_dtype', [fp8.FORWARD_DTYPE, fp8.GRADIENT_DTYPE])
@pytest.mark.parametrize('amax', [448.0, 449.0, 447.9, 57344.0, 3e-5, 1.0, 2.0**-20, 1234.5])
def test_scale_is_the_smallest_power_of_two_that_fits(fp8_dtype, amax):
  x = jnp.array([amax, -amax / 3, 0.0], jnp.float32)
  q, scale = jax.jit(fp8.quantize, static_argnums=1)(x, fp8_dtype)
  fmax = float(jnp.finfo(fp8_dtype).max)
  scale = float(scale)
  assert math.log2(scale) == round(math.log2(scale))  # A power of two.
  assert amax / scale <= fmax < amax / (scale / 2)  # It fits; half of it would not.
  assert np.all(np.isfinite(np.asarray(q, np.float32)))
  assert float(q[0]) * scale == pytest.approx(amax, rel=2**-3)


def test_zeros_quantize_to_zeros():
  q, scale = fp8.quantize(jnp.zeros((3, 4), jnp.bfloat16), fp8.FORWARD_DTYPE)
  assert float(scale) == 1.0 and not np.any(np.asarray(q, np.float32))


# (lhs shape, rhs shape, dimension numbers): a Dense layer, the attention's query projection (kernel
# D x heads x head_dim) and its output projection (contracting heads and head_dim).
_PRODUCTS = [
    ((4, 7, 32), (32, 24), (((2,), (0,)), ((), ()))),
    ((4, 7, 32), (32, 4, 8), (((2,), (0,)), ((), ()))),
    ((4, 7, 4, 8), (4, 8, 32), (((2, 3), (0, 1)), ((), ()))),
    ((2, 16, 64), (64, 48), (((2,), (0,)), ((), ()))),  # Dimensions cuBLASLt's FP8 matmul takes.
]


@pytest.mark.parametrize('lhs_shape,rhs_shape,dims', _PRODUCTS)
def test_product_and_gradients_are_those_of_the_quantized_operands(lhs_shape, rhs_shape, dims):
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  lhs, rhs = _wide_range(k1, lhs_shape), _wide_range(k2, rhs_shape)
  out = jax.jit(lambda a, b: fp8.fp8_dot_general(a, b, dims))(lhs, rhs)
  cotangent = _wide_range(k3, out.shape)
  grads = jax.jit(
      jax.grad(lambda a, b: jnp.sum(fp8.fp8_dot_general(a, b, dims) * cotangent), argnums=(0, 1))
  )(lhs, rhs)

  # NumPy in float64: the operands and the cotangent rounded through the formats, then the products
  # the dimension numbers name, as einsum subscripts.
  lhs_q, rhs_q, cotangent_q = (
      _numpy_qdq(lhs, E4M3),
      _numpy_qdq(rhs, E4M3),
      _numpy_qdq(cotangent, E5M2),
  )
  (contract_l, contract_r), _ = dims
  letters = iter('abcdefgh')
  l_sub = [next(letters) for _ in lhs_shape]
  r_sub = [next(letters) for _ in rhs_shape]
  for i, j in zip(contract_l, contract_r):
    r_sub[j] = l_sub[i]
  o_sub = [c for i, c in enumerate(l_sub) if i not in contract_l] + [
      c for j, c in enumerate(r_sub) if j not in contract_r
  ]
  l_sub, r_sub, o_sub = (''.join(s) for s in (l_sub, r_sub, o_sub))
  expected = np.einsum(f'{l_sub},{r_sub}->{o_sub}', lhs_q, rhs_q)
  expected_lhs = np.einsum(f'{o_sub},{r_sub}->{l_sub}', cotangent_q, rhs_q)
  expected_rhs = np.einsum(f'{o_sub},{l_sub}->{r_sub}', cotangent_q, lhs_q)
  for got, want in zip((out, *grads), (expected, expected_lhs, expected_rhs)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
  # And not the unquantized product: the test sees the rounding.
  assert np.abs(np.asarray(out) - np.einsum(f'{l_sub},{r_sub}->{o_sub}', lhs, rhs)).max() > 1e-3


def _model(matmul, scan=False, dtype=jnp.float32):
  return variants.make_model(
      'ViT-Ti_16',
      {'matmul': matmul, 'num_layers': 2, 'scan': scan},
      num_classes=None,
      dtype=dtype,
  )


@pytest.mark.parametrize('scan', [False, True])
def test_every_block_product_is_quantized_and_nothing_else(scan):
  images = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
  params = _model('default').init(jax.random.key(1), images, train=False)
  assert jax.tree.structure(
      _model('fp8', scan).init(jax.random.key(1), images, train=False)
  ) == jax.tree.structure(params)

  def loss(p):
    return jnp.sum(_model('fp8', scan).apply(p, images, train=False) ** 2)

  text = str(jax.make_jaxpr(jax.grad(loss))(params))
  # Per block: query, key, value, out, and the MLP's two layers, each with two e4m3 operands and one
  # e5m2 gradient; a scanned encoder traces one block.
  blocks = 1 if scan else 2
  assert text.count('new_dtype=float8_e4m3fn') == 6 * 2 * blocks
  assert text.count('new_dtype=float8_e5m2') == 6 * blocks
  features = _model('fp8', scan).apply(params, images, train=False)
  exact = _model('default').apply(params, images, train=False)
  error = float(jnp.linalg.norm(features - exact) / jnp.linalg.norm(exact))
  assert 1e-3 < error < 0.2  # Quantized, and no more than 3 mantissa bits' worth.


def test_bfloat16_model_runs_its_products_from_bfloat16():
  images = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
  model = _model('fp8', dtype=jnp.bfloat16)
  params = model.init(jax.random.key(1), images, train=False)
  grads = jax.grad(lambda p: jnp.sum(model.apply(p, images, train=False).astype(jnp.float32)))(
      params
  )
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))


def test_matmul_is_validated_and_resumable():
  with pytest.raises(ValueError, match="Unknown model.matmul 'fp16': use one of default, fp8"):
    variants.get_model_config('ViT-B_16', {'matmul': 'fp16'})
  assert not variants.function_changes(('ViT-B_16', {}), ('ViT-B_16', {'matmul': 'fp8'}))


def test_runs_natively_only_on_gpus_with_fp8_tensor_cores():
  class Device:

    def __init__(self, platform, compute_capability=None):
      self.platform, self.compute_capability = platform, compute_capability

  assert fp8.runs_natively(Device('gpu', '9.0')) and fp8.runs_natively(Device('gpu', '8.9'))
  assert fp8.runs_natively(Device('gpu', '10.0'))
  assert not fp8.runs_natively(Device('gpu', '8.6')) and not fp8.runs_natively(Device('gpu', '8.0'))
  assert not fp8.runs_natively(Device('cpu')) and not fp8.runs_natively(Device('tpu'))
  assert not fp8.runs_natively(jax.devices('cpu')[0])


@pytest.mark.slow  # Two demo runs of 1000 steps: make test-all's.
def test_fp8_trains_the_demo_as_the_default_products_do(tmp_path, data_dir):
  results = {}
  for matmul in ('default', 'fp8'):
    workdir = str(tmp_path / matmul)
    overrides = {
        'data_dir': data_dir,
        'model.matmul': matmul,
        'total_steps': 1000,
        'eval_every_steps': 1000,
        'checkpoint_every_steps': 1000,
    }
    # On one CPU device, as the demo runs (and faster than on the tests' 8).
    run = helpers.run_main(
        'configs/demo.py', workdir, overrides, env=helpers.on_devices(1), timeout=1800
    )
    assert run.returncode == 0, run.stderr[-3000:]
    scalars = helpers.read_scalars(workdir)
    results[matmul] = scalars['eval_top1'][1000], scalars['train_loss']
  # Measured on a 2-core Zen 4, when these ran on the tests' 8 fake devices: top-1 96.94% / 96.67%;
  # the curves' windows of 100 steps at most 0.014 apart (2.05 at the first, 0.52 at the last).
  (top1, losses), (fp8_top1, fp8_losses) = results['default'], results['fp8']
  assert sorted(losses) == sorted(fp8_losses) == list(range(100, 1001, 100))
  for step, loss in losses.items():
    assert abs(fp8_losses[step] - loss) <= 0.05 + 0.05 * loss, step
  assert top1 >= 0.93 and fp8_top1 >= 0.93 and abs(fp8_top1 - top1) <= 0.03


@pytest.mark.skipif(
    not fp8.runs_natively(jax.devices()[0]), reason='FP8 tensor cores: NVIDIA GPUs of 8.9 and up'
)
def test_fp8_products_compile_to_cublaslt_fp8_matmuls_on_gpu():
  """The gradient of a bfloat16 ViT-B block: its 6 products forward and 12 backward are cuBLASLt's FP8
  matmuls (the products' numbers on a GPU: test_product_and_gradients_..., whose last shapes suit
  cuBLASLt)."""
  images = jax.random.normal(jax.random.key(0), (8, 224, 224, 3), jnp.bfloat16)
  model = variants.make_model(
      'ViT-B_16', {'matmul': 'fp8', 'num_layers': 1}, num_classes=None, dtype=jnp.bfloat16
  )
  params = model.init(jax.random.key(1), images, train=False)
  grad = jax.jit(
      jax.grad(lambda p: jnp.sum(model.apply(p, images, train=False).astype(jnp.float32) ** 2))
  )
  # XLA may merge the products that share an operand (the query, key and value projections).
  assert fp8.fp8_matmul_calls(grad.lower(params).compile().as_text()) >= 12
  assert all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in jax.tree.leaves(grad(params)))


def test_emulated_fp8_is_a_warning_at_setup(tmp_path, data_dir, caplog):
  from vit_jax.train import setup as train_setup  # pylint: disable=g-import-not-at-top

  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, 'model.matmul': 'fp8'}
  )
  train_setup.prepare(config, str(tmp_path / 'run'))
  warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert len(warnings) == 1 and warnings[0].startswith(
      "model.matmul='fp8' is emulated on cpu: the operands are rounded to FP8, their products "
      'computed in config.dtype=float32, with no speed-up'
  ), warnings


@pytest.mark.devices(8)
def test_fp8_products_over_a_mesh_are_those_on_one_device():
  """Each scale is of the whole tensor, not of a device's shard: with the batch split over 4 devices
  and the kernel's outputs over 2, the product is the one device's to float32's rounding (a shard's
  own scales would move values by FP8's, 2**-4). Bit-equal on Zen 4 (AVX-512); on Zen 3 (AVX2)
  XLA's CPU kernel sums a shard's smaller product in another order."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ('data', 'tensor'))
  k1, k2 = jax.random.split(jax.random.key(0))
  lhs, rhs = _wide_range(k1, (8, 5, 32)), _wide_range(k2, (32, 16))
  dims = (((2,), (0,)), ((), ()))
  product = jax.jit(lambda a, b: fp8.fp8_dot_general(a, b, dims))
  grads = jax.jit(jax.grad(lambda a, b: jnp.sum(fp8.fp8_dot_general(a, b, dims) ** 3), (0, 1)))
  sharded = (
      jax.device_put(lhs, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))),
      jax.device_put(
          rhs, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, 'tensor'))
      ),
  )
  want = product(lhs, rhs)
  np.testing.assert_allclose(product(*sharded), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
  for got, want in zip(grads(*sharded), grads(lhs, rhs)):  # Summed in another order.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.devices(8)
def test_fp8_training_over_a_mesh_trains_as_on_one_device(tmp_path, data_dir):
  """The same run on fsdp x tensor and on one device. Float32 sums in another order over a mesh, and
  where that moves a value across an FP8 rounding boundary the value lands in the next bin: the runs
  agree to FP8's rounding, not float32's (on the same mesh a run repeats to the bit)."""
  from vit_jax.train import setup as train_setup  # pylint: disable=g-import-not-at-top

  overrides = {
      **helpers.TINY,
      'data_dir': data_dir,
      'model.matmul': 'fp8',
      'mesh': (('fsdp', 4), ('tensor', 2)),
      'optim.name': 'sgd',
      'optim.weight_decay': 0.0,
      'lr.base': 0.1,
  }
  setup = train_setup.prepare(helpers.load_config('demo', overrides), str(tmp_path / 'mesh'))
  (losses, state), (one_losses, one_state) = helpers.train_on_mesh_and_one_device(
      setup, str(tmp_path / 'one')
  )
  _, initial = helpers.train_losses(setup, [])
  # Measured (2-core Zen 4): losses 3.5e-5 apart at the third step; each parameter's change over the
  # three steps at most 4% of its size apart.
  np.testing.assert_allclose(losses, one_losses, rtol=2e-4)
  for a, b, start in zip(*(jax.tree.leaves(s.params) for s in (state, one_state, initial))):
    a, b, start = (np.asarray(x, np.float64) for x in (a, b, start))
    assert np.linalg.norm(a - b) <= 0.15 * np.linalg.norm(b - start) + 1e-9
