"""A Google Cloud Storage on localhost for the tests: gcp-storage-emulator (PyPI), in memory.

The programs reach it as they reach GCS, by gs:// URLs, once their environment names it (`env`):
`etils.epath` through gcsfs (`EPATH_USE_TF=false`: TensorFlow's GCS client has its endpoints compiled
in) and orbax's arrays through tensorstore (`TENSORSTORE_GCS_HTTP_URL`). Run as a script it serves
until killed:

  python tests/gcs_emulator.py PORT BUCKET
"""

import socket
import subprocess
import sys
import time
import urllib.request


def _serve(port: int, bucket: str) -> None:
  """The emulator, mended where tensorstore needs more than it gives: a download must carry its
  object's generation (x-goog-generation), which tensorstore reads back as the condition of its next
  write (the OCDBT manifest); without it every checkpoint save fails with "Malformed StorageGeneration".
  """
  from gcp_storage_emulator import server  # pylint: disable=g-import-not-at-top
  from gcp_storage_emulator.handlers import objects  # pylint: disable=g-import-not-at-top

  original_download = objects.download

  def download(request, response, storage, *args, **kwargs):
    original_download(request, response, storage, *args, **kwargs)
    if response.status.value in (200, 206):
      obj = storage.get_file_obj(request.params['bucket_name'], request.params['object_id'])
      response['x-goog-generation'] = obj['generation']

  objects.download = download  # What `objects.get` calls for ?alt=media, tensorstore's reads.
  for _, handlers in server.HANDLERS:
    for method, handler in handlers.items():
      if handler is original_download:
        handlers[method] = download
  server.create_server('127.0.0.1', port, in_memory=True, default_bucket=bucket).run()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class GcsEmulator:
  """The emulator in a child process, with one bucket; `env` points a program's GCS clients at it."""

  def __init__(self, bucket: str, log_path: str):
    self.bucket = bucket
    self.url = f'http://127.0.0.1:{_free_port()}'
    self.env = {
        'EPATH_USE_TF': 'false',
        'STORAGE_EMULATOR_HOST': self.url,
        'TENSORSTORE_GCS_HTTP_URL': self.url,
        'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'emulator',
        # gcsfs's default file system asks a Google endpoint what kind of bucket this is, per call.
        'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false',
    }
    port = self.url.rsplit(':', 1)[1]
    self._log_path = log_path
    with open(log_path, 'wb') as log:
      self._process = subprocess.Popen(
          [sys.executable, __file__, port, bucket], stdout=log, stderr=subprocess.STDOUT
      )
    deadline = time.monotonic() + 60
    while not self._answers():
      if self._process.poll() is not None or time.monotonic() > deadline:
        self.close()
        with open(log_path) as log:
          raise RuntimeError(f'the GCS emulator did not start: {log.read()[-2000:]}')
      time.sleep(0.2)

  def _answers(self) -> bool:
    try:
      with urllib.request.urlopen(f'{self.url}/storage/v1/b/{self.bucket}', timeout=2):
        return True
    except OSError:
      return False

  def close(self) -> None:
    self._process.kill()
    self._process.wait()


if __name__ == '__main__':
  _serve(int(sys.argv[1]), sys.argv[2])
