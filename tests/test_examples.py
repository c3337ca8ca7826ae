"""Smoke tests of the examples: a few steps with tiny settings; each prints its metrics as
a JSON object on its last stdout line, and its loss falls."""

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
import mini_cnn  # noqa: E402
import mini_dit  # noqa: E402
import mini_transformer  # noqa: E402


def _last_json_line(capsys):
  lines = capsys.readouterr().out.strip().splitlines()
  return json.loads(lines[-1])


def test_mini_cnn_smoke(capsys, tmp_path):
  mini_cnn.main(["--norm", "group", "--epochs", "2", "--batch-size", "64", "--out", str(tmp_path)])
  result = _last_json_line(capsys)
  assert {"norm", "test_accuracy", "epochs", "seconds"} <= set(result)
  assert result["norm"] == "group" and result["epochs"] == 2
  assert result["final_loss"] < result["initial_loss"]
  assert result["test_accuracy"] > 0.3  # well above chance (0.1) after two short epochs
  assert os.path.getsize(result["plot"]) > 10_000


def test_mini_cnn_nnx_smoke(capsys, tmp_path):
  mini_cnn.main(
    [
      "--api",
      "nnx",
      "--norm",
      "batch",
      "--epochs",
      "2",
      "--batch-size",
      "64",
      "--out",
      str(tmp_path),
    ]
  )
  result = _last_json_line(capsys)
  assert result["api"] == "nnx" and result["norm"] == "batch" and result["epochs"] == 2
  assert result["final_loss"] < result["initial_loss"]
  assert result["test_accuracy"] > 0.3
  assert os.path.getsize(result["plot"]) > 10_000


@pytest.mark.parametrize("norm", mini_cnn.NORMS)
def test_mini_cnn_nnx_builds_every_norm(norm):
  model = mini_cnn.NNXCNN(norm, rngs=nnx.Rngs(0), batch_size=2)
  x = np.zeros((2, 8, 8, 1), np.float32)
  assert model(x).shape == (2, 10)
  assert bool(nnx.state(model, nnx.BatchStat)) == (norm in ("batch", "renorm", "ghost"))


@pytest.mark.parametrize("norm", mini_cnn.NORMS)
def test_mini_cnn_builds_every_norm(norm):
  model = mini_cnn.CNN(norm)
  x = np.zeros((2, 8, 8, 1), np.float32)
  variables = model.init(jax.random.key(0), x, train=False)
  assert model.apply(variables, x, train=False).shape == (2, 10)
  assert ("batch_stats" in variables) == (norm in ("batch", "renorm", "ghost"))


def test_by_class_batches_hold_one_class_each():
  labels = mini_cnn.load_data()[2]
  epoch = mini_cnn.batches(labels, 8, "by-class", np.random.default_rng(0))
  assert all(len(set(labels[idx])) == 1 and len(idx) == 8 for idx in epoch)
  assert len({int(labels[idx[0]]) for idx in epoch[:30]}) > 3  # classes interleaved
  iid = mini_cnn.batches(labels, 8, "iid", np.random.default_rng(0))
  assert len(iid) == len(labels) // 8 and len(set(np.concatenate(iid))) == len(iid) * 8


def test_mini_cnn_renorm_and_ghost_train(capsys, tmp_path):
  for norm, api in (("renorm", "linen"), ("ghost", "nnx")):
    mini_cnn.main(
      ["--norm", norm, "--api", api, "--epochs", "2", "--batch-size", "8", "--order",
       "by-class", "--out", str(tmp_path)]
    )  # fmt: skip
    result = _last_json_line(capsys)
    assert result["norm"] == norm and result["order"] == "by-class"
    assert result["final_loss"] < result["initial_loss"]


def test_mini_cnn_equinox_trains(capsys):
  """--api equinox with BatchNorm (its State, inference_mode)."""
  pytest.importorskip("equinox")
  result = mini_cnn.train("batch", batch_size=64, epochs=2, out=None, progress=False, api="equinox")
  assert result["api"] == "equinox" and result["final_loss"] < result["initial_loss"]
  assert result["test_accuracy"] > 0.3


def test_mini_cnn_equinox_names_the_norms_it_has():
  pytest.importorskip("equinox")
  with pytest.raises(ValueError, match="--api equinox has the norms"):
    mini_cnn.main(["--api", "equinox", "--norm", "renorm", "--epochs", "1", "--out", ""])


def test_mini_cnn_batchnorm_eval_is_per_image(rng):
  """With running averages, an image gets the same logits alone or in a batch."""
  model = mini_cnn.CNN("batch")
  x = mini_cnn.load_data()[1][:16]
  variables = model.init(jax.random.key(0), x, train=False)
  variables = {
    **variables,
    "batch_stats": jax.tree_util.tree_map(
      lambda v: v + rng.uniform(0.1, 0.5, v.shape).astype(v.dtype), variables["batch_stats"]
    ),
  }
  together = model.apply(variables, x, train=False)
  alone = np.concatenate([model.apply(variables, x[i : i + 1], train=False) for i in range(16)])
  np.testing.assert_allclose(together, alone, atol=1e-5)


def test_mini_transformer_smoke(capsys, tmp_path):
  mini_transformer.main(
    ["--steps", "40", "--dim", "32", "--layers", "1", "--context", "32", "--out", str(tmp_path)]
  )
  out = capsys.readouterr().out.strip().splitlines()
  assert any(line.startswith("sample: And God said") for line in out)
  result = json.loads(out[-1])
  assert {"norm", "initial_loss", "final_loss", "steps", "seconds"} <= set(result)
  assert result["steps"] == 40
  assert result["final_loss"] < 0.9 * result["initial_loss"]
  assert os.path.getsize(result["plot"]) > 10_000


def test_mini_transformer_nnx(capsys):
  result = mini_transformer.train(
    "rms", steps=30, dim=32, layers=1, context=16, eval_every=10, out=None, progress=False,
    sample_length=5, api="nnx", qk_norm="flat",
  )  # fmt: skip
  assert _last_json_line(capsys) == result
  assert result["api"] == "nnx" and result["final_loss"] < 0.9 * result["initial_loss"]


def test_mini_transformer_dyt(capsys):
  """DyT in the Pre-LN stack (no Add & Norm to fuse: the addition comes first)."""
  result = mini_transformer.train(
    "dyt", steps=30, dim=32, layers=1, context=16, eval_every=10, out=None, progress=False,
    sample_length=0,
  )  # fmt: skip
  assert result["norm"] == "dyt" and result["final_loss"] < 0.9 * result["initial_loss"]


def test_qk_norm_scales_have_the_reduced_axes_shape():
  """Per head (Qwen3, Gemma 3): one scale of head_dim; flattened (OLMo 2): heads × head_dim."""
  tokens = jnp.zeros((1, 8), jnp.int32)
  for qk_norm, shape in (("head", (8,)), ("flat", (4, 8))):
    model = mini_transformer.CharTransformer(10, 8, 32, layers=1, qk_norm=qk_norm)
    params = model.init(jax.random.key(0), tokens)["params"]
    attention = params["Block_0"]["QKNormAttention_0"]
    assert attention["query_norm"]["scale"].shape == shape
    assert attention["key_norm"]["scale"].shape == shape
  nnx_model = mini_transformer.NNXCharTransformer(10, 8, 32, layers=1, qk_norm="flat",
                                                  rngs=nnx.Rngs(0))  # fmt: skip
  assert nnx_model.blocks[0].attention.norms[0].scale.shape == (32,)  # (laid onto (4, 8))


def test_mini_transformer_post_ln_rms(capsys):
  result = mini_transformer.train(
    "rms",
    post_ln=True,
    qk_norm="head",
    steps=30,
    dim=32,
    layers=1,
    context=16,
    eval_every=10,
    sample_length=0,
    out=None,
    progress=False,
  )
  assert _last_json_line(capsys) == result
  assert result["norm"] == "rms" and result["post_ln"] is True
  assert result["final_loss"] < result["initial_loss"]


def test_small_batch_study_report_follows_its_numbers(tmp_path):
  import small_batch_study as study

  acc = {
    order: {
      n: {b: [0.9, 0.92] for b in study.BATCHES if order == "iid" or b <= 4} for n in study.NORMS
    }
    for order in study.ORDERS
  }
  acc["iid"]["ghost"] = {128: [0.95, 0.95]}
  acc["by-class"]["batch"][2] = [0.6, 0.62]  # BatchNorm collapses on one-class batches
  ft = {"pretrained": [0.97, 0.97]}
  ft.update({f"{n}/{o}": [0.9, 0.9] for n in ("batch", "frozen") for o in study.ORDERS})
  ft["frozen/by-class"] = [0.96, 0.97]
  args = argparse.Namespace(seeds=2, epochs=8, pre_epochs=12)
  study.write_report(str(tmp_path), acc, ft, args, 60.0)
  text = (tmp_path / "small_batch.md").read_text()
  cells = "0.910 ± 0.010 (0.900–0.920) | 0.610 ± 0.010 (0.600–0.620) | 0.910 ± 0.010 (0.900–0.920)"
  assert f"| batch | {cells} | — |" in text
  assert "BatchNorm 0.610 ± 0.010 (below its 0.910 at batch 128" in text
  assert "Batch Renorm 0.910 ± 0.010 (above BatchNorm)" in text
  assert "frozen 0.965 ± 0.005 — frozen is above training BatchNorm" in text
  assert os.path.getsize(tmp_path / "small_batch.png") > 10_000
  # --report writes the same page from the run's JSON, without training
  study.main(["--report", str(tmp_path / "small_batch.json"), "--out", str(tmp_path / "again")])
  assert (tmp_path / "again" / "small_batch.md").read_text() == text


def test_compare_norms_report_follows_its_numbers(tmp_path):
  import compare_norms as study

  cnn = {n: {b: [[0.9, 1.0], [0.92, 1.0]] for b in study.BATCH_SIZES} for n in study.CNN_NORMS}
  cnn["batch"][128] = [[0.99, 1.0], [0.97, 1.0]]

  def runs(finals):  # (one Transformer result per seed)
    return [
      dict(initial_loss=4.0, final_loss=f, seconds=10.0, val_curve=[4.0, 2.0, f], eval_every=50)
      for f in finals
    ]

  tf = {"layer-pre": runs([1.30, 1.34]), "rms-pre": runs([1.29, 1.36])}
  tf.update({"layer-post": runs([1.3, 1.3]), "rms-post": runs([1.2, 1.2])})
  args = argparse.Namespace(seeds=2, tf_seeds=2, epochs=8, steps=600)
  study.write_report(str(tmp_path), cnn, tf, args, 60.0)
  text = (tmp_path / "norm_comparison.md").read_text()
  assert "| batch | 0.910 ± 0.010 (0.900–0.920) |" in text
  assert "0.980 ± 0.010 (0.970–0.990) |" in text
  assert "| rms | pre-LN | 4.000 | 1.325 ± 0.035 (1.290–1.360) | 0.331 | 10.0 |" in text
  assert "RMSNorm's lower in 1 of 2 seeds; Post-LN 1.300 vs 1.200, in 2 of 2" in text
  assert "best norm there is **batch** (0.980)" in text
  study.main(["--report", str(tmp_path / "norm_comparison.json"), "--out", str(tmp_path / "b")])
  assert (tmp_path / "b" / "norm_comparison.md").read_text() == text


def test_compare_norms_extends_the_transformer_seeds(tmp_path, monkeypatch):
  """``--extend`` trains a run's Transformer configurations from the seeds it has up to
  ``--tf-seeds`` and keeps its CNN results."""
  import compare_norms as study

  cnn = {n: {b: [[0.9, 1.0]] for b in study.BATCH_SIZES} for n in study.CNN_NORMS}

  def result(final):
    return dict(initial_loss=4.0, final_loss=final, seconds=10.0, val_curve=[4.0, final],
                eval_every=50)  # fmt: skip

  tf = {n: [result(1.3)] for n in ("layer-pre", "rms-pre", "layer-post", "rms-post")}
  args = argparse.Namespace(seeds=1, tf_seeds=1, epochs=8, steps=600)
  study.write_report(str(tmp_path), cnn, tf, args, 60.0)
  asked = []

  def fake(steps, seeds, first=0):
    asked.append((steps, seeds, first))
    return {n: [result(1.2) for _ in range(first, seeds)] for n in tf}

  monkeypatch.setattr(study, "run_transformer", fake)
  path = str(tmp_path / "norm_comparison.json")
  study.main(["--extend", path, "--tf-seeds", "3", "--out", str(tmp_path / "b")])
  assert asked == [(600, 3, 1)]
  with open(tmp_path / "b" / "norm_comparison.json") as f:
    run = json.load(f)
  assert [r["final_loss"] for r in run["transformer"]["rms-post"]] == [1.3, 1.2, 1.2]
  assert run["args"]["tf_seeds"] == 3 and run["cnn"]["batch"]["2"] == [[0.9, 1.0]]
  assert "over 3 seeds" in (tmp_path / "b" / "norm_comparison.md").read_text()


def test_seed_study_resumes_and_reports(tmp_path, monkeypatch):
  """The seed study trains only the (configuration, seed) pairs its JSON lacks, seed by
  seed, and its tables count on the seeds every configuration finished."""
  import seed_study as study

  trained = []

  def fake(config, seed):  # (a loss that depends on both, like a training's)
    trained.append((config["norm"], config.get("qk_norm"), seed))
    loss = {"layer": 1.3, "rms": 1.25, "dyt": 1.45}[config["norm"]] + 0.01 * seed
    return dict(initial_loss=4.2 + seed / 10, final_loss=loss, seconds=1.0)

  monkeypatch.setitem(study.STUDIES, "qk_norm", (study.QK_CONFIGS, fake))
  path = str(tmp_path / "qk.json")
  study.run("qk_norm", 1, path)
  assert len(trained) == 6 and {t[2] for t in trained} == {0}
  study.run("qk_norm", 3, path, first=2)  # (a second process: seed 2)
  study.run("qk_norm", 2, path)  # (resumes: seed 1 only)
  assert len(trained) == 18 and {t[2] for t in trained[6:12]} == {2}
  assert {t[2] for t in trained[12:]} == {1} and len(study.load(path)) == 18
  runs = study.load(path)
  runs = [r for r in runs if r["seed"] < 2 or r["config"] == "--norm rms"]
  table = study.qk_norm_table(runs)  # (seed 2, unfinished but for RMSNorm, is left out)
  assert "| `mini_transformer.py` (800 steps), 2 seeds |" in table
  assert "| `--norm rms` | 1.255 ± 0.005 (1.250–1.260) | 2 of 2 |" in table
  assert "| `--norm dyt --qk-norm head` | 1.455 ± 0.005 (1.450–1.460) | 0 of 2 |" in table
  assert "Seeds 0–1, from 4.2–4.3 nats/char at the start" in table
  assert study.main(["qk_norm", "--report", "--json", path]) == study.qk_norm_table(
    study.load(path)
  )
  full = [dict(r, seed=s) for s in range(20) for r in study.load(path) if r["seed"] == 0]
  table = study.qk_norm_table(full)  # (all 20 seeds: the reading says no "so far")
  assert "Seeds 0–19," in table and "so far" not in table
  assert "`python examples/seed_study.py qk_norm --seeds 20`" in table

  dit = [dict(config="--models token --dim 80", seed=s, val_loss=0.15 + s / 100,
              class_accuracy=0.8 - s / 10, parameters=327284, seconds=1.0,
              classifier_accuracy_on_real=0.97) for s in range(3)]  # fmt: skip
  assert study.dit_width_row(dit) == (
    "| class token, `--dim 80` (3 seeds) | 327,284 | 0.150–0.170 (0.160) | 0.600–0.800 (0.700) |"
  )


def test_guides_quote_the_seed_studies():
  """modern.md's QK-norm table and reading, and the wider-token row and sentence, are what
  ``seed_study.py --report`` prints from the committed runs (the sentence rewrapped)."""
  import seed_study as study

  guide = open(os.path.join(os.path.dirname(__file__), "..", "docs", "guides", "modern.md")).read()
  for name, report in study.REPORTS.items():
    runs = study.load(os.path.join(study.STUDY_DIR, f"{name}.json"))
    for piece in report(runs).split("\n\n"):
      assert " ".join(piece.split()) in " ".join(guide.split()), (name, piece)


def test_norm_comparison_page_and_which_norm_follow_the_committed_runs(tmp_path):
  """docs/studies/norm_comparison.md is what ``compare_norms.py --report`` writes from the
  committed runs (20 seeds of each Transformer configuration), and which_norm.md quotes
  their Transformer figures."""
  import compare_norms as study

  docs = os.path.join(os.path.dirname(__file__), "..", "docs")
  runs = os.path.join(docs, "studies", "norm_comparison.json")
  study.main(["--report", runs, "--out", str(tmp_path)])
  with open(os.path.join(docs, "studies", "norm_comparison.md")) as f:
    committed = f.read()
  # (line 3 names the machine that rewrote the page)
  assert (tmp_path / "norm_comparison.md").read_text().split("\n")[3:] == committed.split("\n")[3:]
  with open(runs) as f:
    tf = json.load(f)["transformer"]
  assert {len(r) for r in tf.values()} == {20}
  with open(os.path.join(docs, "which_norm.md")) as f:
    guide = " ".join(f.read().split())
  final = {k: np.array([r["final_loss"] for r in v]) for k, v in tf.items()}
  ln, rms, post_ln, post_rms = (
    final[k] for k in ("layer-pre", "rms-pre", "layer-post", "rms-post")
  )
  assert (
    f"({ln.mean():.3f} and {rms.mean():.3f} Pre-LN, RMSNorm lower in {(rms < ln).sum()} of 20 "
    f"seeds; {post_ln.mean():.3f} and {post_rms.mean():.3f} Post-LN, in "
    f"{(post_rms < post_ln).sum()} of 20;" in guide
  )
  every = np.concatenate(list(final.values()))
  assert f"every seed within {every.min():.2f}–{every.max():.2f})" in guide


def test_small_batch_study_runs_a_tiny_grid(monkeypatch):
  import small_batch_study as study

  monkeypatch.setattr(study, "NORMS", ("renorm",))
  acc = study.run_grid(seeds=1, epochs=1, batches=(4,))
  assert set(acc) == {"iid", "by-class"} and set(acc["by-class"]) == {"renorm"}
  assert all(0.1 < a["renorm"][4][0] <= 1.0 for a in acc.values())


def test_export_cnn_round_trip(capsys, tmp_path):
  import export_cnn

  export_cnn.main(["--epochs", "1", "--out", str(tmp_path)])
  result = _last_json_line(capsys)
  assert result["platforms"] == ["cpu", "cuda", "rocm", "tpu"]
  assert result["predictions_agree"]
  assert result["max_logit_difference"] < 1e-4 * max(1.0, result["max_logit"])
  assert result["exported_test_accuracy"] == result["test_accuracy"] > 0.5
  assert os.path.getsize(result["artifact"]) == result["artifact_bytes"] > 1000


def test_port_resnet18_matches_pytorch(capsys):
  """The ported ResNet-18 gives PyTorch's recorded logits (eval and training mode) and
  running statistics to float32 rounding; a layout or ε mistake is off by far more."""
  import port_resnet18

  port_resnet18.main([])
  result = _last_json_line(capsys)
  diff, scale = result["max_difference"], result["max_logit"]
  assert diff["eval_logits"] < 2e-6 * scale and diff["train_logits"] < 2e-6 * scale
  assert diff["running_mean"] < 1e-6 and diff["running_var"] < 1e-5
  # PyTorch's axis=1 kept for NHWC data: at 128 px bn1 sees (2, 64, 64, 64), 64 rows and
  # 64 channels, no shape error, and its output is far off (the comparison would catch it).
  model, variables = port_resnet18.port(port_resnet18.torch_state_dict())
  h = np.random.default_rng(0).normal(size=(2, 64, 64, 64)).astype(np.float32)
  bn1 = {c: tree["bn1"] for c, tree in variables.items()}
  right = model.norm(use_running_average=True).apply(bn1, h)
  wrong = model.norm(use_running_average=True, axis=1).apply(bn1, h)
  assert np.abs(wrong - right).max() > 0.1 * np.abs(right).max()


def test_mini_dit_smoke(capsys, tmp_path):
  """Both conditionings train (the zero-initialised output predicts ε = 0 at first: loss 1),
  sample every class and write their figures."""
  mini_dit.main(["--steps", "30", "--dim", "16", "--depth", "1", "--timesteps", "10",
                 "--eval-every", "15", "--per-class", "2", "--out", str(tmp_path)])  # fmt: skip
  result = _last_json_line(capsys)
  for name in ("adaln", "token"):
    assert result[name]["val_loss"] < 0.9
    assert 0 <= result[name]["class_accuracy"] <= 1
    assert os.path.getsize(result[name]["samples"]) > 5_000
  assert result["adaln"]["parameters"] > result["token"]["parameters"]  # the projections
  assert os.path.getsize(result["plot"]) > 10_000


def test_mini_dit_nnx_is_the_linen_model():
  """The NNX model has the Linen model's parameters, and both predict zero noise at first
  (AdaLN-Zero and the zero-initialised readout)."""
  x, t, y = jnp.ones((2, 8, 8)), jnp.array([3, 7]), jnp.array([1, 9])
  for conditioning in mini_dit.MODELS:
    linen = mini_dit.DiT(16, 1, conditioning=conditioning)
    params = jax.jit(linen.init)(jax.random.key(0), x, t, y)["params"]
    model = mini_dit.NNXDiT(16, 1, conditioning=conditioning, rngs=nnx.Rngs(0))
    sizes = [sorted(a.size for a in jax.tree_util.tree_leaves(tree))
             for tree in (params, nnx.state(model, nnx.Param))]  # fmt: skip
    assert sizes[0] == sizes[1]
    np.testing.assert_array_equal(nnx.jit(lambda m: m(x, t, y))(model), 0.0)
    np.testing.assert_array_equal(jax.jit(linen.apply)({"params": params}, x, t, y), 0.0)
