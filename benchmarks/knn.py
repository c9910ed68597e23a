"""DINO's weighted k-NN classifier of frozen features: ours (vit_jax/evaluators/knn.py, the train
features split over the devices, jitted) against DINO's own loop in PyTorch (eval_knn.py's
knn_classifier: one matrix product and top-k a chunk of test images, votes scattered into one-hot
rows), and optionally scikit-learn's KNeighborsClassifier (brute force, cosine, DINO's weights).

  python benchmarks/knn.py --train=100000 --test=10000 --dim=384 --classes=1000 --k=20 [--sklearn]

Features: Gaussian clusters, one a class, that overlap (the classifier errs on some). Each side is
timed from host features to the accuracy, `--rounds` times, alternating; the best round of each is
kept. Every side must give the same accuracy.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def features(args: argparse.Namespace) -> tuple[np.ndarray, ...]:
  rng = np.random.default_rng(0)
  centres = rng.normal(0, 0.3, (args.classes, args.dim)).astype(np.float32)
  out = []
  for n in (args.train, args.test):
    labels = rng.integers(0, args.classes, n)
    out += [centres[labels] + rng.normal(0, 1, (n, args.dim)).astype(np.float32), labels]
  return tuple(out)


def ours(train_x, train_y, test_x, test_y, k: int, temperature: float) -> float:
  from vit_jax import sharding  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluators import knn  # pylint: disable=g-import-not-at-top

  mesh = sharding.make_mesh((('data', -1),))
  return knn.knn_accuracy(
      train_x, train_y, test_x, test_y, ks=(k,), temperature=temperature, mesh=mesh
  )[k]


def dino(train_x, train_y, test_x, test_y, k: int, temperature: float) -> float:
  """DINO's eval_knn.py knn_classifier (features normalised first, as its caller does), on CPU."""
  import torch  # pylint: disable=g-import-not-at-top

  train = torch.nn.functional.normalize(torch.from_numpy(train_x), dim=1).t()
  test = torch.nn.functional.normalize(torch.from_numpy(test_x), dim=1)
  train_labels, test_labels = torch.from_numpy(train_y), torch.from_numpy(test_y)
  num_classes = int(max(train_y.max(), test_y.max())) + 1
  correct, chunk = 0, max(1, len(test) // 100)  # DINO's 100 chunks.
  one_hot = torch.zeros(chunk * k, num_classes)
  with torch.no_grad():
    for start in range(0, len(test), chunk):
      rows = test[start : start + chunk]
      similarity = torch.mm(rows, train)
      distances, indices = similarity.topk(k, largest=True, sorted=True)
      neighbours = torch.gather(train_labels.view(1, -1).expand(len(rows), -1), 1, indices)
      one_hot.resize_(len(rows) * k, num_classes).zero_()
      one_hot.scatter_(1, neighbours.view(-1, 1), 1)
      weights = distances.clone().div_(temperature).exp_()
      probs = torch.sum(
          torch.mul(one_hot.view(len(rows), -1, num_classes), weights.view(len(rows), -1, 1)), 1
      )
      predictions = probs.argmax(1)
      correct += int((predictions == test_labels[start : start + chunk]).sum())
  return correct / len(test)


def sklearn_side(train_x, train_y, test_x, test_y, k: int, temperature: float) -> float:
  from sklearn import neighbors  # pylint: disable=g-import-not-at-top

  classifier = neighbors.KNeighborsClassifier(
      n_neighbors=k,
      metric='cosine',
      algorithm='brute',
      weights=lambda distance: np.exp((1 - distance) / temperature),
      n_jobs=-1,
  )
  return float(classifier.fit(train_x, train_y).score(test_x, test_y))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--train', type=int, default=100_000)
  parser.add_argument('--test', type=int, default=10_000)
  parser.add_argument('--dim', type=int, default=384)
  parser.add_argument('--classes', type=int, default=1000)
  parser.add_argument('--k', type=int, default=20)
  parser.add_argument('--temperature', type=float, default=0.07)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--sklearn', action='store_true', help='time scikit-learn too (slow)')
  args = parser.parse_args()
  data = features(args)
  sides = {'ours (jax)': ours, "DINO's (torch)": dino}
  if args.sklearn:
    sides['scikit-learn'] = sklearn_side
  seconds = {name: [] for name in sides}
  accuracy = {}
  ours(*data, args.k, args.temperature)  # Compiles, outside the timings (a run compiles once).
  for _ in range(args.rounds):
    for name, side in sides.items():
      start = time.perf_counter()
      accuracy[name] = side(*data, args.k, args.temperature)
      seconds[name].append(time.perf_counter() - start)
  if len(set(accuracy.values())) != 1:
    raise SystemExit(f'the sides disagree: {accuracy}')
  import jax  # pylint: disable=g-import-not-at-top

  peer = min(seconds["DINO's (torch)"])
  print(
      f'# {args.train} train / {args.test} test features of {args.dim}, {args.classes} classes, '
      f'k={args.k}: top-1 {accuracy["ours (jax)"]:.4f} on every side; {os.cpu_count()} cores, '
      f'{jax.device_count()} jax devices; best of {args.rounds}'
  )
  print("| side | seconds | as fast as DINO's x |")
  print('|---|---|---|')
  for name, times in seconds.items():
    print(f'| {name} | {min(times):.3f} | {peer / min(times):.2f} |')


if __name__ == '__main__':
  main()
