"""Writes PyTorch's outputs for examples/port_resnet18.py: torchvision's ResNet-18
structure with the example's weights, in evaluation and for one training step.

Run where PyTorch is installed (it is not a dependency of jaxnorm, its tests or examples):

  python tools/resnet18_reference.py [--out examples/data/resnet18_pytorch.npz]

The model is torchvision's ``resnet18`` when torchvision imports, else the same structure
defined here (the same module names, so the same ``state_dict`` loads into either).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from port_resnet18 import STAGES, torch_state_dict  # noqa: E402


class BasicBlock(nn.Module):
  def __init__(self, cin, cout, stride):
    super().__init__()
    self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
    self.bn1 = nn.BatchNorm2d(cout)
    self.relu = nn.ReLU()
    self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
    self.bn2 = nn.BatchNorm2d(cout)
    self.downsample = None
    if stride != 1 or cin != cout:
      self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))  # fmt: skip

  def forward(self, x):
    y = self.relu(self.bn1(self.conv1(x)))
    y = self.bn2(self.conv2(y))
    return self.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
  def __init__(self, num_classes):
    super().__init__()
    self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
    self.bn1 = nn.BatchNorm2d(64)
    self.relu = nn.ReLU()
    self.maxpool = nn.MaxPool2d(3, 2, 1)
    cin = 64
    for i, cout in enumerate(STAGES, start=1):
      stride = 1 if i == 1 else 2
      setattr(self, f"layer{i}", nn.Sequential(BasicBlock(cin, cout, stride),
                                               BasicBlock(cout, cout, 1)))  # fmt: skip
      cin = cout
    self.avgpool = nn.AdaptiveAvgPool2d(1)
    self.fc = nn.Linear(512, num_classes)

  def forward(self, x):
    x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
    for i in range(1, 5):
      x = getattr(self, f"layer{i}")(x)
    return self.fc(torch.flatten(self.avgpool(x), 1))


def make_model(num_classes=10):
  try:
    import torchvision

    return torchvision.models.resnet18(num_classes=num_classes), "torchvision"
  except Exception:  # not installed, or built for another torch
    return ResNet18(num_classes), "this file's copy of torchvision's structure"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="examples/data/resnet18_pytorch.npz")
  args = ap.parse_args(argv)
  model, source = make_model()
  model.load_state_dict({k: torch.as_tensor(v) for k, v in torch_state_dict().items()})
  x = torch.randn((2, 3, 64, 64), generator=torch.Generator().manual_seed(0))
  model.eval()
  with torch.no_grad():
    eval_logits = model(x)
    model.train()
    train_logits = model(x)
  bn = model.layer1[0].bn1
  np.savez_compressed(
    args.out,
    torch_version=np.array(torch.__version__),
    x=x.numpy(),
    eval_logits=eval_logits.numpy(),
    train_logits=train_logits.numpy(),
    **{f"layer1.0.bn1.{k}": getattr(bn, k).numpy() for k in ("running_mean", "running_var")},
  )
  print(f"wrote {args.out} ({source}, torch {torch.__version__})")


if __name__ == "__main__":
  main()
