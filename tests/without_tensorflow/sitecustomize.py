"""Makes this process one where TensorFlow is not installed: put this folder first on PYTHONPATH
(helpers.WITHOUT_TENSORFLOW). `import tensorflow` then fails as it does where it is absent, and
importlib's find_spec says it is not there: tfds and etils ask importlib, so sys.modules['tensorflow'] =
None (which says it is loaded) would break them where the real absence does not."""

import importlib.machinery
import sys


class _WithoutTensorFlow(importlib.machinery.PathFinder):

  @classmethod
  def find_spec(cls, name, path=None, target=None):
    if name.partition('.')[0] == 'tensorflow':
      return None
    return super().find_spec(name, path, target)


sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = _WithoutTensorFlow
