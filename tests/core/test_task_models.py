"""Series and class models: parallel == step by step == prefill in two chunks, constant state, save/load."""

from __future__ import annotations

import pytest
import torch

from aaren_core.checkpoint import load_checkpoint, save_checkpoint
from aaren_core.nn.backbones import BackboneConfig
from aaren_core.tasks.classify.model import ClassModel, ClassModelConfig, class_loss, final_logits
from aaren_core.tasks.series.model import SeriesModel, SeriesModelConfig, pinball_loss, series_loss

KINDS = ["aaren", "transformer", "gru"]


def series_model(kind: str, time_features: int = 4, seed: int = 0, time_decay: bool = False) -> SeriesModel:
    torch.manual_seed(seed)
    backbone = BackboneConfig(kind=kind, d_model=16, n_layers=2, n_heads=2, time_decay=time_decay)
    model = SeriesModel(SeriesModelConfig(backbone, n_channels=3, horizon=5, time_features=time_features)).eval()
    model.set_normalization(torch.tensor([1.0, -2.0, 0.0]), torch.tensor([2.0, 0.5, 1.0]))
    return model


def class_model(kind: str, seed: int = 0) -> ClassModel:
    torch.manual_seed(seed)
    model = ClassModel(ClassModelConfig(BackboneConfig(kind=kind, d_model=16, n_layers=2, n_heads=2), 3, 4)).eval()
    model.set_normalization(torch.tensor([1.0, -2.0, 0.0]), torch.tensor([2.0, 0.5, 1.0]))
    return model


def series_steps(model, values, feats, state=None):
    state = model.init_state(values.shape[0]) if state is None else state
    ys = []
    for t in range(values.shape[1]):
        y, state = model.step(values[:, t], feats[:, t], state)
        ys.append(y)
    return torch.stack(ys, 1), state


@pytest.mark.parametrize("kind", KINDS)
def test_series_forward_equals_steps_and_two_chunk_prefill(kind):
    model = series_model(kind)
    values, feats = torch.randn(2, 23, 3) * 3, torch.randn(2, 23, 4)
    with torch.no_grad():
        out = model(values, feats)
        y_step, _ = series_steps(model, values, feats)
        y1, st = model.prefill(values[:, :9], feats[:, :9])
        y2, st = model.prefill(values[:, 9:], feats[:, 9:], st)
        y_rest, _st_rest = series_steps(
            model, values[:, 17:], feats[:, 17:], model.prefill(values[:, :17], feats[:, :17])[1]
        )
    assert out.mean.shape == (2, 23, 5, 3) and out.quantiles.shape == (2, 23, 5, 3, 3)
    for y in (y_step, torch.cat([y1, y2], 1)):
        step_out = model.heads(y)
        assert (step_out.mean - out.mean).abs().max() < 1e-5
        assert (step_out.quantiles - out.quantiles).abs().max() < 1e-5
    assert (model.heads(y_rest).mean - out.mean[:, 17:]).abs().max() < 1e-5
    assert st.n_events.tolist() == [23, 23]
    assert (out.quantiles.diff(dim=-1) > 0).all()


def test_series_time_decay_resumes_exactly():
    model = series_model("aaren", time_features=0, time_decay=True)
    values = torch.randn(1, 30, 3)
    with torch.no_grad():
        y = model.prefill(values)[0]
        y1, st = model.prefill(values[:, :11])
        y2, _ = model.prefill(values[:, 11:], state=st)
    assert (torch.cat([y1, y2], 1) - y).abs().max() < 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_class_forward_equals_steps_and_two_chunk_prefill(kind):
    model = class_model(kind)
    values = torch.randn(3, 19, 3)
    values[1, 4, 2] = float("nan")
    with torch.no_grad():
        logits = model(values)
        state, steps = model.init_state(3), []
        for t in range(19):
            lt, state = model.step(values[:, t], state)
            steps.append(lt)
        l1, st = model.prefill(values[:, :7])
        l2, st = model.prefill(values[:, 7:], st)
    assert logits.shape == (3, 19, 4) and torch.isfinite(logits).all()
    assert (torch.stack(steps, 1) - logits).abs().max() < 1e-5
    assert (torch.cat([l1, l2], 1) - logits).abs().max() < 1e-5
    assert st.n_events.tolist() == [19, 19, 19]


def test_state_size_constant_for_both_tasks():
    s, c = series_model("aaren", time_features=0), class_model("aaren")
    sizes = []
    with torch.no_grad():
        for n in (1, 50, 2000):
            x = torch.randn(1, n, 3)
            sizes.append((s.backbone.state_nbytes(s.prefill(x)[1]), c.backbone.state_nbytes(c.prefill(x)[1])))
    assert sizes[0] == sizes[1] == sizes[2]


def test_pinball_is_minimized_by_the_quantile():
    target = torch.randn(4000)
    levels = torch.tensor([0.1, 0.5, 0.9])
    grid = torch.linspace(-3, 3, 601)
    losses = torch.stack([pinball_loss(g.expand(4000, 3), target, levels).mean(0) for g in grid])  # [G, Q]
    best = grid[losses.argmin(0)]
    assert torch.allclose(best, torch.quantile(target, levels), atol=0.03)


def test_series_loss_respects_mask_and_terms():
    model = series_model("gru", time_features=0)
    out = model(torch.randn(2, 6, 3))
    target = torch.randn(2, 6, 5, 3)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[0, 2] = True
    loss, terms = series_loss(out, target, mask, torch.tensor(model.config.quantiles), quantile_weight=0.5)
    err = out.mean[0, 2] - target[0, 2]
    assert terms["mse"].item() == pytest.approx(err.square().mean().item(), rel=1e-5)
    assert terms["mae"].item() == pytest.approx(err.abs().mean().item(), rel=1e-5)
    assert loss.item() == pytest.approx((terms["mse"] + 0.5 * terms["pinball"]).item(), rel=1e-5)
    loss.backward()


def test_class_loss_final_and_early_terms():
    logits = torch.randn(2, 4, 3, requires_grad=True)
    labels, lengths = torch.tensor([2, 0]), torch.tensor([4, 2])
    final = final_logits(logits, lengths)
    assert torch.equal(final[1], logits[1, 1])
    loss, terms = class_loss(logits, labels, lengths, aux_weight=0.5)
    ce = torch.nn.functional.cross_entropy
    early = (ce(logits[0], labels[0].repeat(4)) + ce(logits[1, :2], labels[1].repeat(2))) / 2
    assert terms["early"].item() == pytest.approx(early.item(), rel=1e-5)
    assert loss.item() == pytest.approx((ce(final, labels) + 0.5 * early).item(), rel=1e-5)
    assert class_loss(logits, labels, lengths)[0].item() == pytest.approx(ce(final, labels).item(), rel=1e-6)


def test_to_raw_inverts_standardization():
    model = series_model("aaren", time_features=0)
    out = model(torch.randn(1, 3, 3))
    raw = model.to_raw(out)
    assert torch.allclose((raw.mean - model.value_mean) / model.value_std, out.mean, atol=1e-6)
    std = model.value_std[:, None]
    assert torch.allclose((raw.quantiles - model.value_mean[:, None]) / std, out.quantiles, atol=1e-5)
    assert (raw.quantiles.diff(dim=-1) > 0).all()


@pytest.mark.parametrize("make", [lambda: series_model("aaren"), lambda: class_model("gru")])
def test_save_load_rebuilds_the_same_function(tmp_path, make):
    model = make()
    version = save_checkpoint(tmp_path, model, {"task": "x"})
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.model_version == version and type(ckpt.model) is type(model)
    assert ckpt.kind in ("series_model", "class_model")
    x = torch.randn(1, 7, 3)
    with torch.no_grad():
        if isinstance(model, SeriesModel):
            feats = torch.randn(1, 7, 4)
            assert torch.equal(model(x, feats).quantiles, ckpt.model(x, feats).quantiles)
            assert torch.equal(ckpt.model.value_std, model.value_std)
            assert ckpt.model.config == model.config
        else:
            assert torch.equal(model(x), ckpt.model(x))


def test_the_gaussian_head_orders_its_quantiles_around_the_mean_and_trains_its_scale():
    torch.manual_seed(3)
    backbone = BackboneConfig(kind="aaren", d_model=16, n_layers=1, n_heads=2)
    model = SeriesModel(
        SeriesModelConfig(backbone, n_channels=2, horizon=4, quantiles=(0.1, 0.5, 0.9), head="gaussian")
    )
    model.set_normalization(torch.tensor([5.0, -1.0]), torch.tensor([2.0, 0.5]))
    values = torch.randn(3, 7, 2)
    f = model(values)
    assert f.std is not None and (f.std > 0).all()
    assert (f.quantiles.diff(dim=-1) > 0).all()
    torch.testing.assert_close(f.quantiles[..., 1], f.mean)  # the median of a Gaussian is its mean
    raw = model.to_raw(f)
    torch.testing.assert_close(raw.std, f.std * model.value_std)
    target = torch.randn(3, 7, 4, 2)
    loss, terms = series_loss(f, target, torch.ones(3, 7, dtype=torch.bool), torch.tensor([0.1, 0.5, 0.9]))
    loss.backward()
    assert "nll" in terms and model.scale_head.weight.grad.abs().sum() > 0
    # The NLL term never moves the mean (detached): with the MSE term off, the mean head gets no gradient.
    model.zero_grad()
    series_loss(model(values), target, torch.ones(3, 7, dtype=torch.bool), torch.tensor([0.1, 0.5, 0.9]))[1][
        "nll"
    ].backward()
    assert model.mean_head.weight.grad is None or model.mean_head.weight.grad.abs().sum() == 0
