"""Random training sessions on the spmd device, each compared with the same session on CPU eager.

A session is plain data (a dict of lists, ints and strings; ``draw_session``): a two-layer
perceptron (relu, gelu or tanh; a mean-squared or cross-entropy loss) whose three parameters,
and the batch, are laid out by random partition specs on a random mesh (uneven dims, so shards
are padded; the padding is poisoned with NaN), an optimizer (SGD with momentum and weight
decay, Adam or AdamW with amsgrad; foreach or not) and a list of actions run in order:

- ``["step", micro, zero, clip]``: ``micro`` forward/backward passes accumulated into the
  gradients (each loss divided by ``micro``), ``clip_grad_norm_(clip)`` unless clip is None,
  then ``optimizer.step()``; ``zero`` is where the step zeroes the gradients: ``"before"`` it,
  ``"after"`` it, or ``"none"`` (they keep accumulating);
- ``["zero_grad", set_to_none]`` outside a step;
- ``["save", fmt]`` / ``["load"]``: a checkpoint of the model and optimizer (``fmt``: ``"dcp"``,
  torch_spmd's ``save_dcp``, or ``"sharded"``, its own format), and restoring the latest one
  (on CPU: deep copies of the state dicts);
- ``["resume"]``: a fresh optimizer restored from the latest checkpoint (a restarted job);
- ``["reshard", p, spec]``: parameter ``p`` laid out anew between steps;
- ``["scale", p, factor]``: parameter ``p`` multiplied in place under ``no_grad``;
- ``["freeze", p, frozen]``: ``requires_grad_(not frozen)`` on parameter ``p``;
- ``["sync"]``: ``mark_step()`` with nothing else.

``replay(session)`` runs it on both sides in lockstep and raises AssertionError at the first
action after which a parameter, gradient or optimizer state differs (float64, rtol 1e-7), or
re-raises the device's error where CPU succeeded. ``shrink`` removes actions and layouts while
the failure persists; ``regression_test`` writes what is left as a pytest file
(tools/fuzz.py drives all of it).
"""
import copy
import os
import pprint
import random
import tempfile
from typing import Any, Callable, Dict, List, Optional

MESHES = {"8": ((8,), ("x",)), "4x2": ((4, 2), ("a", "b")), "2x4": ((2, 4), ("a", "b")),
          "2x2x2": ((2, 2, 2), ("a", "b", "c"))}
SIZES = [2, 3, 4, 5, 6, 7, 8, 9, 10, 12]
OPTIMIZERS = ("sgd", "adam", "adamw")
ACTIVATIONS = ("relu", "gelu", "tanh")
RTOL, ATOL = 1e-7, 1e-9


def _spec(rng: random.Random, axes, rank: int) -> list:
    """Each mesh axis unused or tiling one dim (several on a dim in a random order)."""
    dims: List[list] = [[] for _ in range(rank)]
    order = list(axes)
    rng.shuffle(order)
    for a in order:
        d = rng.randrange(-1, rank)
        if d >= 0:
            dims[d].append(a)
    return [None if not d else (d[0] if len(d) == 1 else list(d)) for d in dims]


def param_shapes(s: dict) -> List[tuple]:
    return [(s["d_in"], s["hidden"]), (s["hidden"],), (s["hidden"], s["d_out"])]


def draw_session(rng: random.Random, max_actions: int = 10) -> dict:
    mesh = rng.choice(sorted(MESHES))
    axes = MESHES[mesh][1]
    s = {"mesh": mesh, "d_in": rng.choice(SIZES), "hidden": rng.choice(SIZES),
         "d_out": rng.choice(SIZES), "batch": rng.choice(SIZES), "seed": rng.randrange(1 << 16)}
    s["specs"] = [_spec(rng, axes, len(shape)) for shape in param_shapes(s)]
    s["batch_spec"] = _spec(rng, axes, 2)
    s["activation"] = rng.choice(ACTIVATIONS)
    s["loss"] = rng.choice(["mse", "cross_entropy"])
    kind = rng.choice(OPTIMIZERS)
    s["optimizer"] = {"kind": kind, "lr": rng.choice([0.1, 0.05, 0.01]),
                      "weight_decay": rng.choice([0.0, 0.01]),
                      "momentum": rng.choice([0.0, 0.9]) if kind == "sgd" else 0.0,
                      "amsgrad": kind != "sgd" and rng.random() < 0.3,
                      "foreach": rng.choice([None, False, True])}
    actions, stepped, saved = [], False, False
    for _ in range(rng.randint(2, max_actions)):
        r = rng.random()
        if r < 0.45 or not stepped:
            actions.append(["step", rng.randint(1, 3), rng.choice(["before", "after", "none"]),
                            rng.choice([None, None, 1.0, 0.05])])
            stepped = True
        elif r < 0.55:
            actions.append(["zero_grad", rng.random() < 0.5])
        elif r < 0.68:
            actions.append(["save", rng.choice(["dcp", "sharded"])])
            saved = True
        elif r < 0.74 and saved:
            actions.append(["load"])
        elif r < 0.78 and saved:
            actions.append(["resume"])
        elif r < 0.81:
            actions.append(["scale", rng.randrange(3), rng.choice([0.5, 0.9, -1.0])])
        elif r < 0.84:
            actions.append(["freeze", rng.randrange(3), rng.random() < 0.6])
        elif r < 0.95:
            p = rng.randrange(3)
            actions.append(["reshard", p, _spec(rng, axes, len(param_shapes(s)[p]))])
        else:
            actions.append(["sync"])
    s["actions"] = actions
    return s


class _Side:
    """One side of a session: the parameters and optimizer, on CPU or on the device."""

    def __init__(self, s: dict, device: bool, workdir: Optional[str]):
        import torch
        self.torch, self.s, self.device, self.workdir = torch, s, device, workdir
        g = torch.Generator().manual_seed(s["seed"])
        self.params = []
        for i, shape in enumerate(param_shapes(s)):
            init = torch.randn(*shape, generator=g, dtype=torch.float64) * 0.5
            self.params.append(self._place(init, s["specs"][i]).requires_grad_())
        self.opt = self._optimizer()
        self.saved: Any = None
        self.batches = 0

    def _optimizer(self):
        o, torch = self.s["optimizer"], self.torch
        if o["kind"] == "sgd":
            return torch.optim.SGD(self.params, lr=o["lr"], momentum=o["momentum"],
                                   weight_decay=o["weight_decay"], foreach=o["foreach"])
        cls = torch.optim.Adam if o["kind"] == "adam" else torch.optim.AdamW
        return cls(self.params, lr=o["lr"], weight_decay=o["weight_decay"],
                   amsgrad=o["amsgrad"], foreach=o["foreach"])

    # -- layouts
    def _mesh(self):
        import numpy as np
        import torch_spmd.distributed.spmd as xs
        shape, names = MESHES[self.s["mesh"]]
        return xs.Mesh(np.arange(8), shape, names)

    def _place(self, x, spec):
        if not self.device:
            return x.clone()
        from spmd_diff import to_device
        return to_device(x, self._mesh(), None if spec is None else _tuple_spec(spec))

    def _sync(self):
        if self.device:
            import torch_spmd.core.xla_model as xm
            xm.mark_step()

    # -- the model
    def _batch(self):
        torch = self.torch
        g = torch.Generator().manual_seed(self.s["seed"] * 1000 + self.batches)
        self.batches += 1
        x = torch.randn(self.s["batch"], self.s["d_in"], generator=g, dtype=torch.float64)
        if self.s["loss"] == "mse":
            y = torch.randn(self.s["batch"], self.s["d_out"], generator=g, dtype=torch.float64)
        else:
            y = torch.randint(0, self.s["d_out"], (self.s["batch"],), generator=g)
        return (self._place(x, self.s["batch_spec"]),
                self._place(y, self.s["batch_spec"][:y.dim()]))

    def _loss(self, x, y):
        w1, b1, w2 = self.params
        h = getattr(self.torch.nn.functional, self.s["activation"])(x @ w1 + b1)
        if self.s["loss"] == "mse":
            return ((h @ w2 - y) ** 2).mean()
        return self.torch.nn.functional.cross_entropy(h @ w2, y)

    # -- actions
    def step(self, micro: int, zero: str, clip: Optional[float] = None):
        if zero == "before":
            self.opt.zero_grad()
        for _ in range(micro):
            x, y = self._batch()
            (self._loss(x, y) / micro).backward()
        if clip is not None:
            self.torch.nn.utils.clip_grad_norm_(self.params, clip)
        self.opt.step()
        if zero == "after":
            self.opt.zero_grad()
        self._sync()

    def zero_grad(self, set_to_none: bool):
        self.opt.zero_grad(set_to_none=set_to_none)
        self._sync()

    def save(self, fmt: str):
        if not self.device:
            self.saved = (copy.deepcopy([p.detach() for p in self.params]),
                          copy.deepcopy(self.opt.state_dict()))
            return
        import torch_spmd.distributed.checkpoint as ckpt
        path = os.path.join(self.workdir, f"ckpt{self.batches}_{fmt}")
        (ckpt.save_dcp if fmt == "dcp" else ckpt.save_sharded)(self._state(), path)
        self.saved = (fmt, path)

    def load(self):
        if not self.device:
            params, state = self.saved
            with self.torch.no_grad():
                for p, q in zip(self.params, params):
                    p.copy_(q)
            self.opt.load_state_dict(copy.deepcopy(state))
            return
        import torch_spmd.distributed.checkpoint as ckpt
        fmt, path = self.saved
        sd = self._state()
        (ckpt.load_dcp if fmt == "dcp" else ckpt.load_sharded)(sd, path)
        self.opt.load_state_dict(sd["optim"])
        self._sync()

    def resume(self):
        """A fresh optimizer restored from the latest checkpoint, as a restarted job does
        (the device primes it first, which leaves no gradients; every parameter has state
        once a step ran, so all are primed, frozen ones too, as prime_optimizer says)."""
        self.opt = self._optimizer()
        if self.device:
            from torch_spmd.distributed.checkpoint import prime_optimizer
            frozen = [not p.requires_grad for p in self.params]
            for p in self.params:
                p.requires_grad_(True)
            prime_optimizer(self.opt)
            for p, f in zip(self.params, frozen):
                p.requires_grad_(not f)
        else:
            for p in self.params:
                p.grad = None
        self.load()

    def scale(self, p: int, factor: float):
        with self.torch.no_grad():
            self.params[p].mul_(factor)
        self._sync()

    def freeze(self, p: int, frozen: bool):
        self.params[p].requires_grad_(not frozen)

    def _state(self) -> dict:
        return {"model": {f"p{i}": p for i, p in enumerate(self.params)},
                "optim": self.opt.state_dict()}

    def reshard(self, p: int, spec):
        if not self.device:
            return
        import torch_spmd.distributed.spmd as xs
        from spmd_diff import poison_padding
        t = self.params[p]
        xs.clear_sharding(t)
        if any(d is not None for d in spec):
            xs.mark_sharding(t, self._mesh(), _tuple_spec(spec))
            poison_padding(t)

    def sync(self):
        self._sync()

    # -- what is compared
    def tensors(self) -> Dict[str, Any]:
        torch = self.torch
        out = {}
        for i, p in enumerate(self.params):
            out[f"param {i}"] = p.detach().cpu()
            if p.grad is not None:
                out[f"grad {i}"] = p.grad.detach().cpu()
            for k, v in self.opt.state.get(p, {}).items():
                if isinstance(v, torch.Tensor):
                    out[f"optimizer {k} of param {i}"] = v.detach().cpu()
        return out


def _tuple_spec(spec) -> tuple:
    return tuple(tuple(d) if isinstance(d, list) else d for d in spec)


def replay(s: dict) -> None:
    """Runs session ``s`` on CPU and on the device in lockstep; AssertionError at the first
    action after which they differ."""
    import torch
    from spmd_diff import ensure_devices
    ensure_devices()
    with tempfile.TemporaryDirectory(prefix="spmd_fuzz_") as workdir:
        cpu, dev = _Side(s, False, None), _Side(s, True, workdir)
        _compare(cpu, dev, "after the set-up", torch)
        for i, action in enumerate(s["actions"]):
            name, args = action[0], action[1:]
            getattr(cpu, name)(*args)
            getattr(dev, name)(*args)
            _compare(cpu, dev, f"after action {i} {action}", torch)


def _compare(cpu: _Side, dev: _Side, when: str, torch) -> None:
    a, b = cpu.tensors(), dev.tensors()
    assert sorted(a) == sorted(b), f"{when}: CPU holds {sorted(a)}, the device {sorted(b)}"
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=RTOL, atol=ATOL,
                                   msg=lambda m, k=k: f"{when}: {k}: {m}")


def failure_of(s: dict) -> Optional[str]:
    """None when session ``s`` replays equal to CPU, else a one-line reason."""
    try:
        replay(s)
        return None
    except Exception as e:  # a mismatch (AssertionError) or the device's error
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {first}"[:400]


def _kind(reason: str) -> str:
    return reason.split(":")[0]


def shrink(s: dict, reason: str, still_fails: Callable[[dict], Optional[str]] = failure_of
           ) -> dict:
    """A smaller session failing the same way (same exception type): actions removed one at a
    time from the end, steps made single micro-batches, then layouts replaced by replicated
    ones, while it still fails."""
    best = copy.deepcopy(s)
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(best["actions"]))):
            trial = copy.deepcopy(best)
            del trial["actions"][i]
            if _valid(trial):
                r = still_fails(trial)
                if r is not None and _kind(r) == _kind(reason):
                    best, changed = trial, True
        for i, a in enumerate(best["actions"]):  # a step of one micro-batch, zeroed before
            if a[0] == "step" and a[1:3] != [1, "before"]:
                trial = copy.deepcopy(best)
                trial["actions"][i] = ["step", 1, "before"] + a[3:]
                r = still_fails(trial)
                if r is not None and _kind(r) == _kind(reason):
                    best, changed = trial, True
        for key in ("specs", "batch_spec"):
            items = best[key] if key == "specs" else [best[key]]
            for j, spec in enumerate(items):
                if all(d is None for d in spec):
                    continue
                trial = copy.deepcopy(best)
                blank = [None] * len(spec)
                if key == "specs":
                    trial["specs"][j] = blank
                else:
                    trial["batch_spec"] = blank
                r = still_fails(trial)
                if r is not None and _kind(r) == _kind(reason):
                    best, changed = trial, True
    return best


def _valid(s: dict) -> bool:
    """Loads follow a save; saves follow a step (the optimizer then has state to save)."""
    stepped = saved = False
    for a in s["actions"]:
        if a[0] == "step":
            stepped = True
        elif a[0] == "save":
            if not stepped:
                return False
            saved = True
        elif a[0] in ("load", "resume") and not saved:
            return False
    return True


def regression_test(s: dict, reason: str, origin: str) -> str:
    """The text of a pytest file that replays session ``s`` (kept as a regression test in
    test/python/fuzz_regressions/)."""
    literal = pprint.pformat(s, width=96, sort_dicts=True)
    return f'''"""A training session tools/fuzz.py found differing from CPU ({origin}):
{reason}
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "..", "..", "tools"))
sys.path.insert(0, os.path.join(_HERE, ".."))

from fuzz_sessions import replay  # noqa: E402

SESSION = {literal}


def test_session_equals_cpu():
    replay(SESSION)
'''


def sessions(seed: int, cases: int, out_dir: str, log: Callable[[str], None] = print,
             max_actions: int = 10) -> List[dict]:
    """Draws and replays ``cases`` sessions from ``seed``; each failure is shrunk and written to
    ``out_dir``. Returns the failures ({case, reason, path})."""
    rng = random.Random(seed)
    failures = []
    for case in range(cases):
        s = draw_session(rng, max_actions)
        reason = failure_of(s)
        if reason is None:
            continue
        small = shrink(s, reason)
        reason = failure_of(small) or reason
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"test_session_seed{seed}_case{case}.py")
        with open(path, "w") as f:
            f.write(regression_test(small, reason, f"sessions --seed {seed}, case {case}"))
        failures.append({"case": case, "reason": reason, "path": path})
        log(f"case {case}: {reason}\n  shrunk to {len(small['actions'])} actions: {path}")
    return failures
