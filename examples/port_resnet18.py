"""Porting a PyTorch model: torchvision's ResNet-18 in Flax, its weights converted with
``jaxnorm.convert``, its outputs compared with PyTorch's.

The weights are a ResNet-18 ``state_dict`` with torchvision's names and shapes (random:
He-initialized convolutions, non-trivial BatchNorm parameters and running statistics), as
``{k: v.numpy() for k, v in torch.load("resnet18.pth").items()}`` gives one. The Flax
model runs channels-last (NHWC, what XLA's convolutions prefer), so the norms are
converted with ``channels_first=False`` (feature axis -1) and the convolution kernels are
transposed from ``OIHW`` to ``HWIO``: the layout of the data and of the norms must agree
(``axis=1`` on NHWC data normalizes over the image's rows).

PyTorch's outputs for the same weights and input, in evaluation and for one training step
(logits, and the first block's running statistics after the step), were recorded by
``tools/resnet18_reference.py`` with PyTorch into ``--reference``; torch is not needed here.

  python examples/port_resnet18.py [--reference examples/data/resnet18_pytorch.npz]

Prints the largest differences from PyTorch and, as its last stdout line, one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from _common import print_result

import jaxnorm
from jaxnorm import convert

STAGES = (64, 128, 256, 512)  # the channels of layer1 .. layer4, two BasicBlocks each
REFERENCE = os.path.join(os.path.dirname(__file__), "data", "resnet18_pytorch.npz")
# PyTorch module name -> Flax path, for every BatchNorm of ResNet-18.
NORM_RULES = {
  r"bn1": r"bn1",
  r"layer(\d)\.(\d)\.bn(\d)": r"layer\1_\2/bn\3",
  r"layer(\d)\.(\d)\.downsample\.1": r"layer\1_\2/downsample_bn",
}


def torch_state_dict(seed: int = 0, num_classes: int = 10) -> dict[str, np.ndarray]:
  """A ResNet-18 ``state_dict`` as NumPy arrays, with torchvision's keys and shapes."""
  rng = np.random.default_rng(seed)
  sd: dict[str, np.ndarray] = {}

  def conv(name, cout, cin, k):
    sd[f"{name}.weight"] = rng.normal(0, np.sqrt(2 / (cin * k * k)), (cout, cin, k, k))

  def bn(name, c):
    sd[f"{name}.weight"] = rng.normal(1.0, 0.2, c)
    sd[f"{name}.bias"] = rng.normal(0.0, 0.2, c)
    sd[f"{name}.running_mean"] = rng.normal(0.0, 0.2, c)
    sd[f"{name}.running_var"] = rng.uniform(0.5, 2.0, c)
    sd[f"{name}.num_batches_tracked"] = np.array(1000)

  conv("conv1", 64, 3, 7)
  bn("bn1", 64)
  cin = 64
  for stage, cout in enumerate(STAGES, start=1):
    for block in range(2):
      name = f"layer{stage}.{block}"
      conv(f"{name}.conv1", cout, cin, 3)
      bn(f"{name}.bn1", cout)
      conv(f"{name}.conv2", cout, cout, 3)
      bn(f"{name}.bn2", cout)
      if block == 0 and stage > 1:  # a strided block changes the shape of its shortcut
        conv(f"{name}.downsample.0", cout, cin, 1)
        bn(f"{name}.downsample.1", cout)
      cin = cout
  sd["fc.weight"] = rng.normal(0, np.sqrt(1 / 512), (num_classes, 512))
  sd["fc.bias"] = rng.normal(0, 0.1, num_classes)
  return {k: v if v.ndim == 0 else v.astype(np.float32) for k, v in sd.items()}


class BasicBlock(nn.Module):
  """torchvision's BasicBlock, NHWC: two 3×3 convolutions with a BatchNorm after each."""

  features: int
  strides: int
  norm: functools.partial
  downsample: bool

  @nn.compact
  def __call__(self, x, train: bool):
    conv = functools.partial(nn.Conv, self.features, use_bias=False)
    norm = functools.partial(self.norm, use_running_average=not train)
    y = conv((3, 3), strides=self.strides, padding=((1, 1), (1, 1)), name="conv1")(x)
    y = nn.relu(norm(name="bn1")(y))
    y = conv((3, 3), padding=((1, 1), (1, 1)), name="conv2")(y)
    y = norm(name="bn2")(y)
    if self.downsample:
      x = conv((1, 1), strides=self.strides, padding="VALID", name="downsample_conv")(x)
      x = norm(name="downsample_bn")(x)
    return nn.relu(x + y)


class ResNet18(nn.Module):
  """torchvision's ResNet-18, NHWC; ``norm`` makes its BatchNorms (the converted ones')."""

  norm: functools.partial
  num_classes: int = 10

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Conv(64, (7, 7), strides=2, padding=((3, 3), (3, 3)), use_bias=False, name="conv1")(x)
    x = nn.relu(self.norm(use_running_average=not train, name="bn1")(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for stage, features in enumerate(STAGES, start=1):
      for block in range(2):
        strides = 2 if block == 0 and stage > 1 else 1
        x = BasicBlock(features, strides, self.norm, downsample=strides == 2,
                       name=f"layer{stage}_{block}")(x, train)  # fmt: skip
    return nn.Dense(self.num_classes, name="fc")(jnp.mean(x, axis=(1, 2)))


def port(state_dict: dict[str, np.ndarray]) -> tuple[ResNet18, dict]:
  """The Flax model and its variables: the norms by ``jaxnorm.convert``, the rest by hand."""
  variables, layers, rest = convert.norms_from_state_dict(
    state_dict, {pattern: ("BatchNorm2d", path) for pattern, path in NORM_RULES.items()},
    channels_first=False,
  )  # fmt: skip
  params = variables["params"]
  for key in rest:
    module, leaf = key.rsplit(".", 1)
    # "layer2.0.downsample.0" -> layer2_0/downsample_conv; "conv1", "fc" stay.
    path = module.replace("downsample.0", "downsample_conv")
    path = (path.replace(".", "_", 1) if path.startswith("layer") else path).split(".")
    node = params
    for name in path:
      node = node.setdefault(name, {})
    w = state_dict[key]
    if leaf == "weight" and w.ndim == 4:
      node["kernel"] = w.transpose(2, 3, 1, 0)  # OIHW -> HWIO
    elif leaf == "weight":
      node["kernel"] = w.T  # Linear (out, in) -> Dense (in, out)
    else:
      node["bias"] = w
  # Every BatchNorm of ResNet-18 has the same constructor arguments: the converted ones.
  kwargs = {k: v for k, v in layers["bn1"].kwargs.items() if k != "use_running_average"}
  return ResNet18(functools.partial(jaxnorm.BatchNorm, **kwargs)), variables


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--reference", default=REFERENCE, help="PyTorch's recorded outputs (.npz)")
  args = ap.parse_args(argv)

  ref = np.load(args.reference)
  model, variables = port(torch_state_dict())
  x = jnp.asarray(ref["x"].transpose(0, 2, 3, 1))  # PyTorch's NCHW input -> NHWC
  # Full float32 convolutions (a GPU's TF32 would add 1e-3 differences of its own).
  with jax.default_matmul_precision("float32"):
    logits = model.apply(variables, x)
    train_logits, updates = model.apply(variables, x, train=True, mutable=["batch_stats"])
  block = updates["batch_stats"]["layer1_0"]["bn1"]
  diffs = {
    "eval_logits": float(np.abs(logits - ref["eval_logits"]).max()),
    "train_logits": float(np.abs(train_logits - ref["train_logits"]).max()),
    "running_mean": float(np.abs(block["mean"] - ref["layer1.0.bn1.running_mean"]).max()),
    "running_var": float(np.abs(block["var"] - ref["layer1.0.bn1.running_var"]).max()),
  }
  scale = float(np.abs(ref["eval_logits"]).max())
  print(
    f"ResNet-18 ported from a PyTorch state_dict, input {tuple(ref['x'].shape)} NCHW -> "
    f"NHWC; PyTorch {ref['torch_version']}"
  )
  for name, d in diffs.items():
    print(f"  max |jaxnorm port - PyTorch| {name:13s} {d:.2e}")
  print_result({"max_difference": diffs, "max_logit": scale, "torch": str(ref["torch_version"])})


if __name__ == "__main__":
  main()
