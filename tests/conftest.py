"""Tests run on CPU with 8 fake devices, so sharding code paths run as on a real mesh."""
import os
import sys

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# torch's optional triton segfaults when loaded after TensorFlow; the CPU tests never need it.
sys.modules.setdefault('triton', None)
