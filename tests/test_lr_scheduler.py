"""ag.optim.lr_scheduler: the learning rates (and OneCycleLR's momentum) step by step equal
to torch's, state_dict round trips, param_groups' 'initial_lr', errors."""

import warnings

import numpy as np
import pytest

import asyncgrad as ag

# these tests step optimizers whose parameters have no gradient: only the schedule matters
pytestmark = pytest.mark.filterwarnings("ignore:SGD.step\\(\\) found no parameter")

STEPS = 30

SCHEDULES = [
    ("StepLR", {"step_size": 4, "gamma": 0.5}),
    ("MultiStepLR", {"milestones": [3, 7, 7, 12]}),
    ("ExponentialLR", {"gamma": 0.9}),
    ("CosineAnnealingLR", {"T_max": 7, "eta_min": 1e-3}),
    ("LambdaLR", {"lr_lambda": lambda epoch: 0.95 ** epoch / (1 + epoch)}),
    ("LinearLR", {}),
    ("LinearLR", {"start_factor": 0.5, "end_factor": 0.9, "total_iters": 8}),
    ("OneCycleLR", {"max_lr": 1.0, "total_steps": STEPS}),
    ("OneCycleLR", {"max_lr": [1.0, 0.3], "epochs": 3, "steps_per_epoch": 11, "three_phase": True,
                    "anneal_strategy": "linear", "pct_start": 0.25}),
]


def _schedule(lib, optimizer, name, kwargs, steps=STEPS):
    w, b = lib.zeros(3, requires_grad=True), lib.zeros(1, requires_grad=True)
    extra = {"momentum": 0.9} if optimizer == "SGD" else {}
    opt = getattr(lib.optim, optimizer)([{"params": [w]}, {"params": [b], "lr": 0.05}], lr=0.1, **extra)
    sched = getattr(lib.optim.lr_scheduler, name)(opt, **kwargs)
    seen = [(sched.get_last_lr(), opt.param_groups[0].get("momentum"), opt.param_groups[0].get("betas"))]
    for _ in range(steps):
        (w.sum() + b.sum()).backward()
        opt.step()
        sched.step()
        seen.append((sched.get_last_lr(), opt.param_groups[0].get("momentum"), opt.param_groups[0].get("betas")))
    return seen, opt, sched


@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
@pytest.mark.parametrize("name, kwargs", SCHEDULES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SCHEDULES)])
def test_learning_rates_equal_torch(name, kwargs, optimizer):
    torch = pytest.importorskip("torch")
    steps = STEPS if name != "OneCycleLR" or "total_steps" in kwargs else 32
    mine, _, _ = _schedule(ag, optimizer, name, kwargs, steps)
    theirs, _, _ = _schedule(torch, optimizer, name, kwargs, steps)
    assert mine == theirs


def test_initial_lr_base_lrs_and_last_epoch():
    w = ag.zeros(2, requires_grad=True)
    opt = ag.optim.SGD([w], lr=0.1)
    sched = ag.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    assert opt.param_groups[0]["initial_lr"] == 0.1 and sched.base_lrs == [0.1]
    assert sched.last_epoch == 0 and sched.get_last_lr() == [0.1]
    for _ in range(3):
        opt.step()
        sched.step()
    assert sched.last_epoch == 3 and opt.param_groups[0]["lr"] == pytest.approx(0.01)


def test_state_dict_round_trip_resumes_the_schedule():
    w = ag.zeros(2, requires_grad=True)
    opt = ag.optim.SGD([w], lr=1.0)
    sched = ag.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    for _ in range(4):
        opt.step()
        sched.step()
    saved = sched.state_dict()
    assert "optimizer" not in saved and saved["last_epoch"] == 4
    later = []
    for _ in range(3):
        opt.step()
        sched.step()
        later.append(sched.get_last_lr())
    opt2 = ag.optim.SGD([w], lr=1.0)
    opt2.load_state_dict(opt.state_dict())
    opt2.param_groups[0]["lr"] = saved["_last_lr"][0]
    sched2 = ag.optim.lr_scheduler.CosineAnnealingLR(opt2, T_max=10)
    sched2.load_state_dict(saved)
    again = []
    for _ in range(3):
        opt2.step()
        sched2.step()
        again.append(sched2.get_last_lr())
    np.testing.assert_allclose(again, later, rtol=1e-15)


def test_lambda_state_dict_keeps_callable_objects_state_only():
    class Warmup:
        def __init__(self):
            self.scale = 2.0

        def __call__(self, epoch):
            return self.scale * epoch

    w = ag.zeros(1, requires_grad=True)
    fn = Warmup()
    sched = ag.optim.lr_scheduler.LambdaLR(ag.optim.SGD([w, ag.zeros(1, requires_grad=True)], lr=0.1), fn)
    state = sched.state_dict()
    assert state["lr_lambdas"] == [{"scale": 2.0}]
    state["lr_lambdas"] = [{"scale": 5.0}]
    sched.load_state_dict(state)
    assert fn.scale == 5.0
    plain = ag.optim.lr_scheduler.LambdaLR(ag.optim.SGD([w], lr=0.1), lambda e: 1.0)
    assert plain.state_dict()["lr_lambdas"] == [None]


def test_step_with_epoch_uses_the_closed_form_and_warns():
    w = ag.zeros(1, requires_grad=True)
    opt = ag.optim.SGD([w], lr=1.0)
    sched = ag.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    with pytest.warns(UserWarning, match="epoch parameter"):
        sched.step(7)
    assert sched.get_last_lr() == [0.25]


def test_errors():
    w = ag.zeros(1, requires_grad=True)
    opt = ag.optim.SGD([w], lr=0.1)
    with pytest.raises(TypeError, match="list is not an Optimizer"):
        ag.optim.lr_scheduler.StepLR([], step_size=1)
    with pytest.raises(KeyError, match="param 'initial_lr' is not specified in param_groups\\[0\\]"):
        ag.optim.lr_scheduler.StepLR(opt, step_size=1, last_epoch=3)
    with pytest.raises(ValueError, match="You must define either total_steps OR"):
        ag.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0)
    with pytest.raises(ValueError, match="optimizer must support momentum or beta1"):
        _no_momentum_optimizer(w)
    one = ag.optim.lr_scheduler.OneCycleLR(ag.optim.SGD([w], lr=0.1, momentum=0.9), max_lr=1.0, total_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one.step()
        one.step()
    with pytest.raises(ValueError, match="Tried to step 3 times. The specified number of total steps is 2"):
        one.step()


def _no_momentum_optimizer(w):
    class Plain(ag.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

        def step(self, closure=None):
            return None

    ag.optim.lr_scheduler.OneCycleLR(Plain([w]), max_lr=1.0, total_steps=5)
