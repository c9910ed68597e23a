"""The checks the self-supervised tasks share (vit_jax/tasks/self_supervised.py)."""

import pytest

import helpers
from vit_jax.train import setup as train_setup


@pytest.mark.parametrize('task', ['mpp', 'mae'])
@pytest.mark.parametrize(
    'field,value,fix',
    [
        ('model.representation_size', 16, 'unset config.model.representation_size'),
        # Its parameters would be absent from the features the few-shot and k-NN evaluators read.
        ('model.classifier', 'map', 'set config.model.classifier to token, gap or token_gap'),
        ('model.head_dropout_rate', 0.1, 'set config.model.head_dropout_rate=0'),
        ('model.head_bias_init', -10.0, 'set config.model.head_bias_init=0'),
        ('model.distilled', True, 'set config.model.distilled=False'),  # A token nothing trains.
        ('model.patch_dropout', 0.5, 'itself: set config.model.patch_dropout=0'),
    ],
)
def test_a_self_supervised_task_has_no_pre_logits_and_no_head(tmp_path, task, field, value, fix):
  config = helpers.load_config(
      f'{task}_demo', {**helpers.TINY, 'data_dir': str(tmp_path / 'tfds'), field: value}
  )
  with pytest.raises(ValueError, match=rf'^config\.task={task} .*{fix}'):
    train_setup.prepare(config, str(tmp_path / 'w'))
