"""The metrics of sentence and sentence-pair tasks, in numpy.

These are the numbers a paper's table reports (GLUE: Matthews correlation for CoLA, F1 for MRPC
and QQP, Pearson/Spearman for STS-B, accuracy elsewhere), so each one follows the definition of
the reference library that the GLUE baselines used — scikit-learn's `matthews_corrcoef` and
`f1_score`, scipy's `pearsonr` and `spearmanr` — including their answers on degenerate input
(a single class, a constant column). They are written here so that the library does not pull
scikit-learn and scipy into every fine-tuning job; the tests check them against both.
"""

from __future__ import annotations

import numpy as np


def _pair(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  if predictions.ndim != 1 or predictions.shape != labels.shape:
    raise ValueError(f"predictions and labels must be 1-D and of equal length; got shapes "
                     f"{predictions.shape} and {labels.shape}.")
  if not len(labels):
    raise ValueError("no examples to score.")
  return predictions, labels


def accuracy(predictions, labels) -> float:
  predictions, labels = _pair(predictions, labels)
  return float(np.mean(predictions == labels))


def f1(predictions, labels, positive=1) -> float:
  """Binary F1 of the `positive` class; 0.0 when neither side has a positive (as scikit-learn)."""
  predictions, labels = _pair(predictions, labels)
  predicted, actual = predictions == positive, labels == positive
  true_positives = np.sum(predicted & actual)
  denominator = 2 * true_positives + np.sum(predicted & ~actual) + np.sum(~predicted & actual)
  return float(2 * true_positives / denominator) if denominator else 0.0


def matthews_corrcoef(predictions, labels) -> float:
  """Matthews correlation (multi-class form, which equals the binary φ for two classes).

  0.0 when either side holds a single class — scikit-learn's convention, and what CoLA scores
  for a model that always predicts "acceptable". Sums are float64: n² overflows int64 products
  at a few hundred thousand examples.
  """
  predictions, labels = _pair(predictions, labels)
  classes, codes = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
  label_codes, prediction_codes = codes[:len(labels)], codes[len(labels):]
  label_counts = np.bincount(label_codes, minlength=len(classes)).astype(np.float64)
  prediction_counts = np.bincount(prediction_codes, minlength=len(classes)).astype(np.float64)
  n = float(len(labels))
  correct = float(np.sum(label_codes == prediction_codes))
  covariance = correct * n - label_counts @ prediction_counts
  label_variance = n * n - label_counts @ label_counts
  prediction_variance = n * n - prediction_counts @ prediction_counts
  if label_variance * prediction_variance == 0:
    return 0.0
  return float(covariance / np.sqrt(label_variance * prediction_variance))


def pearson(predictions, labels) -> float:
  """Pearson's r; NaN when a column is constant or holds NaN, or with fewer than two examples."""
  x, y = _pair(predictions, labels)
  x, y = x.astype(np.float64), y.astype(np.float64)
  if len(x) < 2 or np.isnan(x).any() or np.isnan(y).any():
    return float("nan")
  x, y = x - x.mean(), y - y.mean()
  norm = np.sqrt(np.sum(x * x)) * np.sqrt(np.sum(y * y))
  if norm == 0:
    return float("nan")
  return float(np.clip(np.sum(x * y) / norm, -1.0, 1.0))


def average_ranks(values) -> np.ndarray:
  """1-based ranks with tied values sharing the mean of their ranks (scipy's 'average')."""
  values = np.asarray(values)
  order = np.argsort(values, kind="stable")
  ordered = values[order]
  starts_run = np.concatenate([[True], ordered[1:] != ordered[:-1]])
  run_of = np.cumsum(starts_run) - 1
  run_starts = np.flatnonzero(starts_run)
  run_ends = np.append(run_starts[1:], len(values))
  ranks = np.empty(len(values), np.float64)
  ranks[order] = ((run_starts + 1 + run_ends) / 2.0)[run_of]
  return ranks


def spearman(predictions, labels) -> float:
  """Spearman's ρ: Pearson's r of the average ranks, so ties count as scipy counts them."""
  x, y = _pair(predictions, labels)
  x, y = x.astype(np.float64), y.astype(np.float64)
  if np.isnan(x).any() or np.isnan(y).any():
    return float("nan")
  return pearson(average_ranks(x), average_ranks(y))
