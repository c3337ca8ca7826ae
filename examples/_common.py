"""Helpers shared by the examples: the JSON result line and the training-curve plots."""

from __future__ import annotations

import json
import os

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402


def print_result(metrics: dict) -> None:
  """Prints ``metrics`` as one JSON object: by contract the last line on stdout."""
  print(json.dumps(metrics), flush=True)


def save_curves(
  path: str, title: str, panels: list[tuple[str, dict[str, list[float]]]], xlabel: str
) -> str:
  """Saves one PNG with a panel per ``(ylabel, {label: values})``; returns its path."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4))
  axes = axes if len(panels) > 1 else [axes]
  for ax, (ylabel, series) in zip(axes, panels, strict=True):
    for label, values in series.items():
      ax.plot(range(1, len(values) + 1), values, marker="o", markersize=3, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1:
      ax.legend()
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
