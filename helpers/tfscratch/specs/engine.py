"""Exercise specs: a table of probes per exercise, and the one engine that turns them into a
plan, runs the plan on the course's reference, and judges what the student's object captured.

Where it runs: in the grader (the coordinator), which decides the grade: the probes' *plan*
goes into the grading sandbox as data and is run there, on the student's object, by `vm.py`;
the captures come back as plain tensors; this module compares them with what the reference
captures on the same plan. The reference is imported here, lazily, and never enters the
graded student's process. And in the student's kernel for the notebook's visible checks
(`tfscratch.checks.kernel`): the same plans and judgement on the public seed, against the
expectations `make release` stored (`stored.py`), not against the reference.

A spec module (`tfscratch/specs/<module>.py`) lists `EXERCISES`:

    Exercise("softmax", ref="attention.softmax",
             graded=grades(rows=1, stable=1, random=(2, 4242)),   # test_softmax_rows, ...
             probes=[
        Probe("large logits", cells=["stable"], calls=[call(randn(3, 9, scale=1000.0))]),
        ...])

- inputs are lazy (`randn`, `randint`, `tokens`, `given`): materialised in the coordinator
  from the run's hidden seed, so every run may use inputs no student has seen;
- `make=` constructs a module (`ctor(...)` arguments), `load="reference"` gives it the
  reference module's parameters (perturbed, so no parameter keeps a default value), copied by
  name; `mode=` is "train" or "eval";
- every call's outputs are compared with the reference's at `atol`/`rtol` (float32 defaults
  of COURSE_SPEC: 1e-5 / 1e-4); `backward=` also compares the input gradients for that
  upstream gradient, `param_grads=True` the parameters' gradients; `raises=True` asks that the
  call raise (any exception); `params=True` compares parameter names, shapes and how many are
  distinct objects; `after=` compares attributes after the calls (running statistics, the
  attention weights kept for plotting);
- `graded=` lists the exercise's graded test cells in the notebook's order, by the part of
  their id after `test_<exercise>_`, with their points (and the hidden tests' seed);
  `make release` writes those cells. `cells=` names the graded test cells the probe backs,
  by the same short ids: a cell scores its points when every probe that backs it passes.
  Every graded cell of a notebook with a spec is backed.
  A cell judges what its name promises (issue 29, fair partial credit): a plain name is
  judged on the values; `shapes("shapes")` only on what the calls return without their
  values (the call runs, raises where it must, every output present with the reference's
  shape and dtype, parameter names and shapes); `batch("batch_axes")` on the shapes
  and on the student's own consistency: a call on `part(...)` of an earlier call's inputs
  (one element of its batch) must give that call's output at the same index. A value
  mistake then fails the value cells only. `memory(...)`: shapes, and the memory keys
  (`shapes=True`, `memory_limit=`) as the probe's `compare=` hook judges them.
"""
from __future__ import annotations

import contextvars
import copy
import hashlib
import importlib
import re
from dataclasses import KW_ONLY, dataclass, field
from functools import lru_cache
from typing import Any, Callable

import numpy as np
import torch

from ..shortcuts import plan_rows
from . import vm

ATOL, RTOL = 1e-5, 1e-4


# -- lazy inputs ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Input:
    build: Callable[[torch.Generator], torch.Tensor]
    what: str = ""
    device: str | None = None    # moved there in the student's kernel ("meta": shapes only)


def randn(*shape, scale: float = 1.0, dtype: str = "float32") -> Input:
    return Input(lambda g: (torch.randn(*shape, generator=g, dtype=torch.float64) * scale)
                 .to(getattr(torch, dtype)), f"randn{tuple(shape)}" + (f" x{scale:g}" if scale != 1 else ""))


def randint(low: int, high: int, *shape) -> Input:
    return Input(lambda g: torch.randint(low, high, shape, generator=g), f"randint{tuple(shape)}")


def given(fn: Callable[[torch.Generator], Any], what: str = "", device: str | None = None) -> Input:
    """Any tensor (or bool mask) computed from the generator, e.g. a mask with a padded tail.
    device="meta" hands the exercise a tensor on PyTorch's meta device (shapes, no values):
    outputs that stay on it are compared by dtype and shape, and one that lands on the CPU
    shows code that ignores its input's device."""
    return Input(fn, what, device)


@dataclass(frozen=True, eq=False)
class Part:
    """One element of an earlier call's input (`index` into its leading axes: ints, or a
    slice that keeps the axis; () = the same tensor): the same numbers, so the student's
    result on it can be compared with the student's own result on the whole batch (a
    `batch(...)` cell)."""
    source: Input
    index: tuple = ()


def part(source: Input, *index: int | slice) -> Part:
    return Part(source, tuple(index))


@dataclass(frozen=True, eq=False)
class Sample:
    """Inputs that must agree (a batch of tokens and its padding mask, one sequence as query,
    key and value, a sequence and the chunks of a cached run), drawn by ONE function: `fn(g)`
    returns a tuple, and `s[i]` is its i-th element, to pass to a call. A probe draws a Sample
    once, where one of its elements is first used; every element comes from that draw."""
    fn: Callable[[torch.Generator], tuple]
    what: str = ""

    def __getitem__(self, i: int) -> "Drawn":
        return Drawn(self, (i,))


@dataclass(frozen=True, eq=False)
class Drawn:
    """Part of a Sample's one draw: its element path[0], then indexed by the rest of `path`
    (`s[0][:, 2:5]`: columns 2:5 of the first element; `s[0][0]`: its first row)."""
    sample: Sample
    path: tuple

    def __getitem__(self, index) -> "Drawn":
        return Drawn(self.sample, self.path + (index,))


def sample(fn: Callable[[torch.Generator], tuple], what: str = "") -> Sample:
    return Sample(fn, what)


ASPECTS = ("values", "shapes", "batch", "memory")


class Cell(str):
    """A graded cell's name, marked with what a probe compares for it (see `shapes`)."""
    compares = "values"


def _cell(name: str, compares: str) -> Cell:
    c = Cell(name)
    c.compares = compares
    return c


def shapes(cell: str) -> Cell:
    """A cell that promises shapes, dtypes, structure or that a call runs (or raises): the
    probe's outputs are judged without their values."""
    return _cell(cell, "shapes")


def memory(cell: str) -> Cell:
    """A cell that promises a memory property (the tensors a call creates, the reductions it
    runs, the process's growth: the probe's `compare=` hook on those keys) and shapes."""
    return _cell(cell, "memory")


def batch(cell: str) -> Cell:
    """A cell that promises any leading batch axes: shapes, and each `part(...)` call equal to
    the student's own result on the whole batch at that index (not to the reference)."""
    return _cell(cell, "batch")


@dataclass
class Call:
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    method: str | None = None
    grad: tuple = ()             # positions / kwarg names of inputs whose gradient is compared
    backward: Input | None = None  # upstream gradient for the output (or output[backward_of])
    backward_of: str = ""
    raises: bool = False
    shapes: bool = False         # capture the shape of every tensor created during the call
    keep: tuple = ()             # positions / kwarg names of tensor args captured AFTER the call
                                 # (updated in place, e.g. running statistics): key `.arg.<i>`
    memory_limit: int = 0        # bytes the whole process's resident memory may grow by during
                                 # the call (every thread counted); key `.memory`: the growth
                                 # past it, else 0 (vm._measured)
    take: int | None = None      # the output is an iterator (a generator): consume it into a list
                                 # (0: all of it; n: its first n items), e.g. encode_iterable


def call(*args, method=None, grad=(), backward=None, backward_of="", raises=False,
         shapes=False, keep=(), memory_limit=0, take=None, **kwargs) -> Call:
    return Call(args, kwargs, method, tuple(grad), backward, backward_of, raises, shapes, tuple(keep),
                memory_limit, take)


def ctor(*args, **kwargs) -> Call:
    return Call(args, kwargs)


def prev(call_index: int, path: str = "") -> dict:
    """An earlier call's output (path "1" = its second element), e.g. a KV cache."""
    return {"$prev": [call_index, path]}


def fixture(name: str, *args, load: str | None = "random") -> dict:
    """A stand-in object built by the probe machine (vm.FIXTURES), with seeded weights."""
    return {"$fixture": name, "args": list(args), "_load": load}


@dataclass(frozen=True)
class DeadRows:
    """Attention weights at capture keys ending in `key`, whose query rows with every key masked
    ("dead") may be all zeros or uniform, but finite; the reference's dead rows are `ref`
    ("zeros" or "uniform"). `hint` says what to do about a NaN there."""
    key: str
    ref: str
    hint: str


@dataclass
class Probe:
    name: str
    cells: tuple
    calls: list
    make: Call | None = None
    load: str | None = None      # "reference": the reference module's (perturbed) parameters
    mode: str | None = None
    after: tuple = ()
    params: bool = False
    param_grads: bool = False
    atol: float = ATOL
    rtol: float = RTOL
    what: str = ""               # what the probe tries, in words, for the message
    compare: Callable | None = None  # (key, got, want) -> message or None, for special keys
    sizes: bool = False          # also compare the lengths of the lists, tuples and dicts the
                                 # calls return (a vocabulary or a merge list with extra entries)
    keep_dtype: bool = False     # every float result keeps the reference's dtype, which is the
                                 # input's (float64 in, float64 out; bf16 in, bf16 out)
    dead_rows: DeadRows | None = None   # fully masked query rows: zeros or uniform, finite
    accept: Callable | None = None   # (Evidence) -> a note or None: a failing probe whose captures
                                     # follow another documented convention passes, with the note

    def __post_init__(self):
        self.cells = tuple(c if isinstance(c, Cell) else _cell(c, "values") for c in self.cells)
        assert {c.compares for c in self.cells} <= set(ASPECTS), self.cells

    @property
    def aspects(self) -> dict:
        """{cell name: what this probe compares for it}."""
        return {str(c): c.compares for c in self.cells}


@dataclass
class Diagnosis:
    """A named mistake: `test(evidence)` is True when a failing probe's captures look like it.
    Built with `like(...)` (the student's output equals what a wrong formula gives on the same
    inputs) or `when(...)` (any property of the evidence: NaN, row sums, an error's text).
    `message` may be a function of the evidence, for a message that names what was found
    (the dtype returned, how many layers)."""
    message: Any
    test: Callable
    probes: tuple = ()           # probe names it applies to; () = every probe of the exercise


def like(message: str, fn: Callable, out: str = "", probes: tuple = (), atol: float = 1e-4,
         rtol: float = 1e-3) -> Diagnosis:
    """The mistake whose output is `fn(*args, **kwargs)` (`fn(ref, *args, **kwargs)` for a
    probe that constructs a module: `ref` is the reference module with the probe's parameters),
    compared with the student's output at `out` ("1": the second element) on every call
    where fn returns a tensor."""
    return Diagnosis(message, lambda e: e.matches(fn, out, atol, rtol), tuple(probes))


def when(message: str, pred: Callable, probes: tuple = ()) -> Diagnosis:
    """The mistake for which `pred(evidence)` is True (see `Evidence`)."""
    return Diagnosis(message, pred, tuple(probes))


def variants(family: Callable, table, probes: tuple = (), make: Callable = when) -> list[Diagnosis]:
    """One diagnosis per row of a table of wrong variants of one formula: `table` maps each
    variant (a name, or a dict of keyword arguments) to its message, as a dict or as
    (variant, message) pairs; `make(message, family(variant), probes)` is its diagnosis (`when`:
    family gives the test that the student's output follows that variant; `like`: the wrong
    formula itself). A new variant of a family is one row."""
    rows = table.items() if isinstance(table, dict) else table
    return [make(msg, family(**v) if isinstance(v, dict) else family(v), probes) for v, msg in rows]


@dataclass(frozen=True)
class Graded:
    """One graded test cell of an exercise, in the notebook's order. `make release` writes it
    (tfsgrade.build, from the source's `# %% [tests] <exercise>` line) as the visible call
    `chk.<id>(<exercise>)`, plus the same call with `seed=hidden_seed` between nbgrader's
    hidden-test markers when there is one. The probes that back it name its id (`cells=`)."""
    id: str
    points: int | float
    hidden_seed: int | None = None


def grades(**cells) -> tuple:
    """An exercise's graded cells in the notebook's order, by the part of their id after
    `test_<exercise>_`: `grades(values=2, sizes=1, random=(2, 5150))` is the cells
    test_<exercise>_values (2 points), ..._sizes (1) and ..._random (2, with hidden tests at seed
    5150). Probes name the same short ids in `cells=`."""
    return tuple(Graded(short, *(p if isinstance(p, tuple) else (p,))) for short, p in cells.items())


@dataclass
class Exercise:
    """One exercise of a notebook: its graded cells, the probes that back them, the known
    mistakes and the shortcut groups it may not use. Every field after the name is keyword-only."""
    name: str
    _: KW_ONLY
    ref: str                     # "module.Name" under tfscratch.reference
    graded: tuple                # Graded cells, in the notebook's order (the test cells)
    probes: list
    needs: tuple = ()            # other names of the namespace the calls use ({"$ns": name})
    diagnose: list = field(default_factory=list)   # Diagnosis entries, most specific first
    shortcuts: tuple = ()        # shortcut groups (tfscratch.shortcuts): the probe machine's guard
                                 # in every probe, the kernel's guard, the grader's scan
    returns: tuple = ()          # the names of a returned tuple's parts, for messages ("weights")

    def __post_init__(self):
        self._full_ids()
        self._check()
        for p in self.probes:    # each probe's messages name the parts of what it returns
            p.returns = self.returns

    def _check(self) -> None:
        ids = [g.id for g in self.graded]
        backed = {str(c) for p in self.probes for c in p.cells}
        if len(set(ids)) != len(ids) or set(ids) != backed:
            raise ValueError(f"{self.name}: the graded cells {ids} are not the cells its probes back "
                             f"{sorted(backed)}: every graded cell needs a probe, every probe's cell a grade")
        bad = [i for i in ids if not i.startswith(f"test_{self.name}_")]
        if bad:
            raise ValueError(f"{self.name}: graded cell ids start with test_{self.name}_: {bad}")

    def _full_ids(self) -> None:
        """Short cell ids (`values`, as `grades(...)` and probes may write them) become
        `test_<exercise>_values`: the notebook's grade ids, which every other part reads."""
        def full(c: str) -> str:
            return c if c.startswith("test_") else f"test_{self.name}_{c}"
        self.graded = tuple(Graded(full(g.id), g.points, g.hidden_seed) for g in self.graded)
        for p in self.probes:
            p.cells = tuple(_cell(full(c), c.compares) for c in p.cells)

    def add(self, probe: "Probe") -> None:
        """A probe added after the entry is built (one that needs an optional fixture)."""
        self.probes.append(probe)
        self._full_ids()
        self._check()   # a mistyped short id backs no graded cell: refused here too

    def reference(self):
        mod, _, obj = self.ref.rpartition(".")
        return getattr(importlib.import_module(f"tfscratch.reference.{mod}"), obj)

    def cells(self) -> set:
        return {g.id for g in self.graded}

    def probes_of(self, cell: str) -> list:
        """The probes that back one graded cell."""
        return [p for p in self.probes if cell in p.aspects]


# -- plans ----------------------------------------------------------------------------------

def _seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "little")


class _Builder:
    def __init__(self, ex: Exercise, run_seed: int):
        self.ex, self.run_seed, self.tensors, self.n = ex, run_seed, {}, 0

    def tensor(self, t) -> dict:
        key = f"t{self.n}"
        self.n += 1
        self.tensors[key] = vm._np(t) if isinstance(t, torch.Tensor) else np.asarray(t)
        if isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16):
            return {"$t": key, "cast": str(t.dtype).replace("torch.", "")}  # stored as float32
        return {"$t": key}

    def value(self, v, g):
        if isinstance(v, Part):       # the same numbers as an input built earlier in this probe
            return self.tensor(self.built[id(v.source)][v.index].clone())
        if isinstance(v, Drawn):      # one element of a Sample, drawn once in this probe
            s = v.sample
            if id(s) not in self.samples:
                self.samples[id(s)] = (s, s.fn(g))     # keep s alive: ids stay unique
            x = self.samples[id(s)][1]
            for index in v.path:
                x = x[index]
            return self.value(x.clone() if isinstance(x, torch.Tensor) else x, g)
        if isinstance(v, Input):
            t = v.build(g)
            self.built[id(v)] = t
            if not isinstance(t, (torch.Tensor, np.ndarray)):   # text, ids, a vocabulary: values
                return self.value(t, g)
            d = self.tensor(t)
            if v.device:
                d["device"] = v.device
            return d
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if isinstance(v, torch.dtype):
            return {"$dtype": str(v).replace("torch.", "")}
        if isinstance(v, tuple):
            return {"$tuple": [self.value(x, g) for x in v]}
        if isinstance(v, list):
            return [self.value(x, g) for x in v]
        if isinstance(v, dict) and "$fixture" in v:
            built = self.__dict__.setdefault("_fixtures", {})   # one fixture object: one model
            if id(v) not in built:
                seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))
                with torch.random.fork_rng():                   # the same stand-in on both sides
                    vm.seed(seed)
                    args = v["args"]    # a spec may fix the stand-in's seed here (transformer._Seeded)
                    obj = vm.FIXTURES[v["$fixture"]](*args) if v.get("_load") == "random" else None
                d = {"$fixture": v["$fixture"], "args": [self.value(a, g) for a in args]}
                if obj is not None:
                    d["load"] = {k: self.tensor(_perturbed(t, g)) for k, t in obj.state_dict().items()}
                built[id(v)] = (v, d)                               # keep v alive: ids stay unique
            return built[id(v)][1]
        if isinstance(v, (bytes, bytearray)):
            return {"$bytes": list(v)}
        if isinstance(v, dict) and not all(isinstance(k, str) for k in v):   # {id: bytes}
            return {"$items": [[k, self.value(x, g)] for k, x in v.items()]}
        if isinstance(v, dict) and not any(k.startswith("$") for k in v):
            return {k: self.value(x, g) for k, x in v.items()}
        return v

    def probe(self, p: Probe) -> dict:
        self.built = {}               # id(Input) -> tensor, for part(...) of this probe's calls
        self.samples = {}             # id(Sample) -> (Sample, its one draw) in this probe
        seed = _seed(self.run_seed, self.ex.name, p.name)
        g = torch.Generator().manual_seed(seed)
        d = {"name": p.name, "seed": seed % 2**31, "mode": p.mode, "after": list(p.after),
             "params": p.params or p.param_grads, "param_grads": p.param_grads}
        if p.make is not None:
            d["make"] = {"args": [self.value(a, g) for a in p.make.args],
                         "kwargs": {k: self.value(v, g) for k, v in p.make.kwargs.items()}}
        if p.load == "reference":
            vm.seed(seed % 2**31)
            ref = self.ex.reference()(*p.make.args, **p.make.kwargs)
            d["load"] = {k: self.tensor(_perturbed(t, g)) for k, t in ref.named_parameters()}
        d["calls"] = []
        for c in p.calls:
            d["calls"].append({
                "method": c.method, "args": [self.value(a, g) for a in c.args],
                "kwargs": {k: self.value(v, g) for k, v in c.kwargs.items()},
                "grad": list(c.grad), "backward": None if c.backward is None else self.value(c.backward, g),
                "backward_of": c.backward_of, "raises": c.raises, "shapes": c.shapes,
                "keep": list(c.keep), **({"memory_limit": c.memory_limit} if c.memory_limit else {}),
                **({"take": c.take} if c.take is not None else {})})
        return d


def _perturbed(t: torch.Tensor, g) -> torch.Tensor:
    """A parameter with no default value left (LayerNorm's ones and zeros would hide a swap)."""
    t = t.detach()
    if not t.is_floating_point():
        return t.clone()
    return t + 0.2 * torch.randn(t.shape, generator=g, dtype=t.dtype) * (t.std() if t.numel() > 1 and t.std() > 0 else 1.0)


def build_plan(ex: Exercise, run_seed: int) -> tuple[dict, dict]:
    """The plan for one exercise (JSON-able) and its tensors, from the run's seed."""
    b = _Builder(ex, run_seed)
    probes = [b.probe(p) for p in ex.probes]
    plan = {"exercise": ex.name, "target": ex.name, "probes": probes}
    if ex.shortcuts:            # refused at the operator level while the probes run (vm._Guard)
        plan["forbid"] = plan_rows(ex.shortcuts)
    return plan, b.tensors


def plan_json(ex: Exercise, run_seed: int) -> dict:
    plan, tensors = build_plan(ex, run_seed)
    plan["tensors"] = vm.pack(tensors)
    return plan


# -- the spec of a notebook -----------------------------------------------------------------

def specs_for(assignment: str) -> list[Exercise]:
    """The exercises of a notebook that have a spec: the spec module whose ASSIGNMENT names
    it (a new notebook's spec is found by itself; no list to edit)."""
    mod = modules().get(assignment)
    return list(mod.EXERCISES) if mod is not None else []


@lru_cache(maxsize=None)
def shortcut_table() -> dict:
    """{exercise name: its shortcut groups} over every spec (an exercise of two notebooks, such
    as rms_norm in 04 and 09, names the same groups in both: checked)."""
    out: dict = {}
    for mod in modules().values():
        for ex in mod.EXERCISES:
            if out.setdefault(ex.name, tuple(ex.shortcuts)) != tuple(ex.shortcuts):
                raise ValueError(f"{ex.name} forbids {out[ex.name]} in one spec and "
                                 f"{tuple(ex.shortcuts)} in another")
    return out


@lru_cache(maxsize=None)
def modules() -> dict:
    """{assignment: spec module} for every module of this package with an ASSIGNMENT."""
    import pkgutil
    from pathlib import Path
    out = {}
    for m in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if m.name in ("engine", "vm", "stored"):
            continue
        mod = importlib.import_module(f"{__package__}.{m.name}")
        if getattr(mod, "ASSIGNMENT", None):
            out[mod.ASSIGNMENT] = mod
    return out


def has_spec(assignment: str) -> bool:
    try:
        return bool(specs_for(assignment))
    except ModuleNotFoundError:
        return False


# -- judgement ------------------------------------------------------------------------------

@dataclass
class Verdict:
    passed: bool
    message: str
    note: str = ""               # a passing cell's word for the student (the convention accepted)


_REFERENCE_RUNS: dict = {}   # (ref, exercise, probe ids, seed) -> (probes, captures)


def reference_run(ex: Exercise, run_seed: int) -> dict:
    """The reference's captures for these probes and seed. They depend on nothing else (the
    plan is built from the seed), so they are computed once per process and copied out: the
    coordinator judges a whole class on one seed, the kernel's progress table repeats the
    public seed's checks, and the catalogues judge every mistake against the same reference."""
    # the probe objects themselves, not their names (04 and 09 both have an rms_norm "random"
    # probe); the entry keeps them alive, so their ids are never reused for other probes
    key = (ex.ref, ex.name, tuple(id(p) for p in ex.probes), run_seed)
    if key not in _REFERENCE_RUNS:
        plan, tensors = build_plan(ex, run_seed)
        res = vm.run_plan(plan, _namespace(ex), tensors=tensors)
        errors = {k: v for k, v in res["meta"].items() if k.endswith(".error")}
        if errors:
            raise RuntimeError(f"the spec of {ex.name} fails on the reference: {errors}")
        if len(_REFERENCE_RUNS) >= 256:
            _REFERENCE_RUNS.pop(next(iter(_REFERENCE_RUNS)))
        _REFERENCE_RUNS[key] = (tuple(ex.probes), res)
    return copy.deepcopy(_REFERENCE_RUNS[key][1])


def _needed(name):
    import tfscratch.reference as r
    return getattr(r, name)


def student_run(ex: Exercise, run_seed: int, namespace: dict) -> dict:
    """Run the probes in this process on a namespace (tests and the in-process lane)."""
    plan, tensors = build_plan(ex, run_seed)
    return vm.run_plan(plan, namespace, tensors=tensors)


def _fmt(a) -> str:
    a = np.asarray(a)
    return np.array2string(a, precision=4, threshold=8, edgeitems=2) if a.ndim else f"{a.item():.6g}"


# the names of the returned tuple's parts of the probe being judged (Exercise.returns)
_RETURNS: contextvars.ContextVar = contextvars.ContextVar("returns", default=())


def label(key: str) -> str:
    """`probe.1.out.0` -> "output[0] of call 2" ("the `weights` (output[1]) of call 2" where
    the exercise names what it returns), for messages."""
    parts = key.split(".")
    if len(parts) >= 3 and parts[1].isdigit():
        n, kind, rest = int(parts[1]) + 1, parts[2], parts[3:]
        if kind == "out":
            names = _RETURNS.get()
            if rest and rest[0].isdigit() and int(rest[0]) < len(names):
                sub = f"[{']['.join(rest[1:])}]" if rest[1:] else ""
                return f"the `{names[int(rest[0])]}{sub}` (output[{']['.join(rest)}]) of call {n}"
            return (f"output[{']['.join(rest)}]" if rest else "the output") + f" of call {n}"
        if kind == "grad":
            return f"the gradient of input {rest[0]} in call {n}"
        if kind == "arg":
            return f"argument {rest[0]} after call {n} (updated in place)"
        return f"{kind} of call {n}"
    if len(parts) >= 3 and parts[1] == "after":
        return f"`{'.'.join(parts[2:])}` after the calls"
    if len(parts) >= 3 and parts[1] == "pgrad":
        return f"the gradient of parameter `{'.'.join(parts[2:])}`"
    return f"`{key}`"


def _at(idx) -> tuple:
    return tuple(int(i) for i in idx)


def compare_key(key, got, want, p: Probe) -> str | None:
    if p.compare is not None:
        msg = p.compare(key, got, want)
        if msg != "default":
            return msg
    if key.endswith((".shapes", ".reduced")):
        return None
    what = label(key)
    if p.keep_dtype and want.dtype.kind == "f" and got.dtype != want.dtype:
        return (f"{what} has dtype {got.dtype}, expected {want.dtype} (the input's dtype): compute "
                "in another dtype if you like, but cast the result back (.to(x.dtype))")
    if p.dead_rows is not None and key.endswith(p.dead_rows.key) and got.shape == want.shape \
            and want.ndim >= 1 and want.shape[-1] >= 2:
        dead = (want == 0).all(-1) if p.dead_rows.ref == "zeros" else np.ptp(want, axis=-1) == 0
        if dead.any():
            return masked_rows(key, got, want, dead, p.dead_rows.hint)
    if want.dtype == np.bool_ and got.dtype != np.bool_:
        extra = (" holding 0 where allowed and -inf (or a large negative number) where blocked: "
                 "an additive mask" if got.dtype.kind == "f" and (got < 0).any() else "")
        return (f"{what} has dtype {got.dtype}{extra}; masks in this course are boolean "
                "(torch.bool), True = may attend")
    if got.shape != want.shape:
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if want.dtype == np.bool_ or np.issubdtype(want.dtype, np.integer):
        if not np.array_equal(got.astype(want.dtype) if got.dtype != want.dtype else got, want) \
                or (got.dtype.kind == "f" and not np.array_equal(got, want)):
            bad = np.argwhere(got != want)
            at = _at(bad[0]) if bad.size else ()
            return (f"{what} differs from the expected values"
                    + (f" at {at}: got {got[at] if at else got}, expected {want[at] if at else want}" if at else
                       f": got {_fmt(got)}, expected {_fmt(want)}"))
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        return _compare_float(what, got, want, p)


def _compare_float(what, got, want, p: Probe) -> str | None:
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    nan_g, nan_w = np.isnan(g64), np.isnan(w64)
    if (nan_g & ~nan_w).any():
        at = _at(np.argwhere(nan_g & ~nan_w)[0])
        return f"{what} has NaN at {at} where the expected value is {w64[at]:.6g}"
    ok = np.isclose(g64, w64, atol=p.atol, rtol=p.rtol, equal_nan=True)
    if not ok.all():
        diff = np.where(ok, 0, np.abs(np.nan_to_num(g64 - w64, nan=np.inf)))
        at = _at(np.unravel_index(np.argmax(diff), diff.shape)) if diff.ndim else ()
        return (f"{what} differs from the expected values by up to {diff.max():.3g} "
                f"(at {at}: got {g64[at]:.6g}, expected {w64[at]:.6g}; "
                f"{int((~ok).sum())} of {ok.size} values outside atol={p.atol:g}, rtol={p.rtol:g})")
    return None


_SIZED = re.compile(r"^(list|tuple|dict)\[\d+\]$")


def _half_dtype(key: str, wm: dict, gm: dict) -> str | None:
    """Half-precision values are captured as float32 numbers, so their dtype is compared from
    the capture's record: a bfloat16 result must come back bfloat16, not float32."""
    w, g = wm.get(key), gm.get(key)
    if w in ("bfloat16", "float16") and isinstance(g, str) and g != w:
        return (f"{label(key)} has dtype {g}, expected {w} for {w} inputs: keep the input's "
                "dtype (compute in float32 inside, then cast the result back with .to(x.dtype))")
    return None


# how the grader's reasons for a check with no result begin (tfsgrade.verdict.PLAIN too)
GRADER_REASONS = ("not run:", "CheckTimeout:", "KernelDied:", "ChildProcess:")


def judge_probe(p: Probe, want: dict, got: dict) -> str | None:
    """None when the student's captures match the reference's, else what differs."""
    err = got["meta"].get(f"{p.name}.error")
    if err:
        # the grader's own reasons (a loop, a time limit, a process beside the check) are not
        # something the student's code raised: said as they are, without their label
        for label_ in GRADER_REASONS:
            if err.startswith(label_):
                return err[len(label_):].strip()
        return f"your code raised {err}"
    token = _RETURNS.set(getattr(p, "returns", ()))
    try:
        return _judge_probe(p, want, got)
    finally:
        _RETURNS.reset(token)


def _judge_probe(p: Probe, want: dict, got: dict) -> str | None:
    wc, wm, gc, gm = want["caps"], want["meta"], got["caps"], got["meta"]
    for key, w in wc.items():
        if not key.startswith(f"{p.name}."):
            continue
        if key not in gc:
            if key.endswith(".raised"):
                return "a call that must raise an error (an input longer than allowed) did not"
            kind = gm.get(key) or gm.get(key.rsplit(".", 1)[0])
            return f"{label(key)} is missing" + (f" (your code gave {kind})" if kind else "")
        if key.endswith(".raised"):
            if bool(gc[key]) != bool(w):
                return ("the call should raise an error but returned normally" if bool(w) else
                        f"the call raised {gm.get(key, 'an error')}")
            continue
        msg = _half_dtype(key, wm, gm) or compare_key(key, np.asarray(gc[key]), np.asarray(w), p)
        if msg:
            return msg
    if p.sizes:                        # containers: as many entries as the reference's
        for key, w in wm.items():
            if key.startswith(f"{p.name}.") and isinstance(w, str) and _SIZED.match(w) \
                    and gm.get(key) != w and f"{p.name}.error" not in gm:
                return f"{label(key)} is {gm.get(key) or 'missing'}, expected {w}"
    for key, w in wm.items():          # outputs on the meta device: dtype and device only
        if key.startswith(f"{p.name}.") and isinstance(w, str) and w.endswith("@meta") \
                and gm.get(key) != w:
            return (f"{label(key)} is {gm.get(key) or 'missing'}, expected {w}: "
                    "the result must be made on the input's device (and dtype)")
    if p.params:
        # What the contract promises: every parameter the specification names is reachable under
        # that name with its shape (names listed with their aliases: a layer kept in an
        # nn.Sequential and exposed as `linear1` counts under both), and as many distinct tensors.
        wp, gp = wm.get(f"{p.name}.params"), gm.get(f"{p.name}.params")
        ids_g, ids_w = gm.get(f"{p.name}.param_ids"), wm.get(f"{p.name}.param_ids")
        if gp is not None and wp is not None:
            ws = {n: tuple(s) for n, s in wp}
            gs = {n: tuple(s) for n, s in gp}
            missing = sorted(n for n in ws if n not in gs)[:3]
            shaped = sorted(n for n in ws if n in gs and gs[n] != ws[n])[:3]
            extra = sorted(n for n in gs if n not in ws)[:3]
            if missing or shaped or (extra and ids_g is not None and ids_w is not None
                                     and ids_g > ids_w):
                return ("the module's parameters differ from the specification's"
                        + (f"; missing {missing}" if missing else "")
                        + (f"; unexpected {extra}" if extra and (missing or ids_g != ids_w) else "")
                        + (f"; other shapes: {[(n, gs[n], ws[n]) for n in shaped]}" if shaped else ""))
        if ids_g != ids_w:
            why = ("a sub-module is shared where each layer needs its own"
                   if ids_g is not None and ids_w is not None and ids_g < ids_w else
                   "a parameter the specification shares (tied) is a separate tensor in yours")
            return (f"the module holds {ids_g} distinct parameter tensors, the specification "
                    f"{ids_w}: {why}")
    for key in wm:
        if key.startswith(f"{p.name}.after.") and str(gm.get(key, "")).startswith("missing"):
            return f"attribute {key.split('.after.')[1]!r} {gm[key]}"
    return None


class Evidence:
    """What a diagnosis sees of one failing probe: the student's and the reference's captures,
    the inputs of each call (materialised as tensors), the error the student's code raised.
    Keys are relative to the probe: "0.out" (call 1's output), "1.out.1", "0.grad.0"."""

    def __init__(self, ex: Exercise, p: Probe, pd: dict, tensors: dict, got: dict, want: dict,
                 problem: str):
        self.ex, self.p, self.pd, self.tensors = ex, p, pd, tensors
        self._got, self._want, self.problem = got, want, problem
        self.error = got["meta"].get(f"{p.name}.error", "") or ""

    def got(self, key: str):
        return self._got["caps"].get(f"{self.p.name}.{key}")

    def want(self, key: str):
        return self._want["caps"].get(f"{self.p.name}.{key}")

    def meta(self, key: str):
        return self._got["meta"].get(f"{self.p.name}.{key}")

    def ref_params(self) -> dict:
        """{name: shape} of the specification's module parameters: from the reference's
        captures when the probe records them (params=True; also what the kernel has, stored),
        else from the reference module itself."""
        ps = self._want["meta"].get(f"{self.p.name}.params")
        if ps is not None:
            return {n: tuple(s) for n, s in ps}
        return {n: tuple(t.shape) for n, t in self.ref().named_parameters()}

    def out(self, ci: int = 0, path: str = ""):
        """The student's output of call `ci` (at `path`), a numpy array or None."""
        return self.got(f"{ci}.out" + (f".{path}" if path != "" else ""))

    def want_out(self, ci: int = 0, path: str = ""):
        return self.want(f"{ci}.out" + (f".{path}" if path != "" else ""))

    def outs(self, path: str = ""):
        """[(student, reference)] for every call with both outputs captured."""
        res = []
        for ci in range(len(self.pd["calls"])):
            g, w = self.out(ci, path), self.want_out(ci, path)
            if g is not None and w is not None:
                res.append((np.asarray(g), np.asarray(w)))
        return res

    def args(self, ci: int = 0):
        """(args, kwargs) of call `ci` as tensors (no gradients); fixtures built."""
        c = self.pd["calls"][ci]
        ctx = vm._Ctx(self.tensors, _namespace(self.ex))
        return ctx.value(c["args"]), ctx.value(c["kwargs"])

    def ref(self):
        """The reference object of this probe: the module it constructs, with the parameters
        the probe loads, in the probe's mode; or the reference function.
        In the student's kernel there is no reference (no answer key there): a module probe's
        diagnoses then see the student's own class, built and loaded the same way, so those
        that recompute a wrong formula from the module's layers and weights still name it."""
        mk = self.pd.get("make")
        try:
            obj = self.ex.reference()
        except ImportError:
            obj = self._got.get("target")
            if mk is None or obj is None:
                raise
        if mk is not None:
            ctx = vm._Ctx(self.tensors, _namespace(self.ex))
            vm.seed(self.pd.get("seed", 0))
            obj = obj(*ctx.value(mk.get("args", [])), **ctx.value(mk.get("kwargs", {})))
            if self.pd.get("load"):
                vm._load(obj, {k: ctx.value(v) for k, v in self.pd["load"].items()})
            if self.pd.get("mode") in ("train", "eval"):
                obj.train(self.pd["mode"] == "train")
        return obj

    def matches(self, fn, out="", atol=1e-4, rtol=1e-3) -> bool:
        """True when, on every call where `fn` gives a tensor, the student's output equals it,
        and on at least one of them the wrong formula differs from the right answer (a call
        the mistake does not change says nothing about it)."""
        n, telling = 0, 0
        ref = self.ref() if self.pd.get("make") is not None else None
        for ci, c in enumerate(self.pd["calls"]):
            g = self.out(ci, out)
            if g is None or c.get("raises"):
                continue
            try:
                args, kwargs = self.args(ci)
                with torch.no_grad(), np.errstate(all="ignore"):
                    r = fn(ref, *args, **kwargs) if ref is not None else fn(*args, **kwargs)
            except Exception:  # noqa: BLE001 - the wrong formula does not apply to this call
                continue
            if r is None:
                continue
            r = np.asarray(vm._np(r) if isinstance(r, torch.Tensor) else r, dtype=np.float64)
            g = np.asarray(g, dtype=np.float64)
            if r.shape != g.shape:
                return False
            with np.errstate(all="ignore"):
                if not np.allclose(g, r, atol=atol, rtol=rtol, equal_nan=True):
                    return False
                w = self.want_out(ci, out)
                w = None if w is None else np.asarray(w, dtype=np.float64)
                if w is None or w.shape != r.shape or not np.allclose(w, r, atol=atol, rtol=rtol, equal_nan=True):
                    telling += 1
            n += 1
        return n > 0 and telling > 0


class _Namespace(dict):
    """The reference's namespace for a probe, looked up only when a value asks for it: in the
    student's kernel the graded notebook's reference is absent, and a diagnosis that needs
    it does not apply there (diagnose() skips it), while the others still run."""

    def __init__(self, ex: Exercise):
        super().__init__()
        self.ex = ex

    def __missing__(self, name):
        value = self.ex.reference() if name == self.ex.name else _needed(name)
        self[name] = value
        return value

    def get(self, name, default=None):
        try:
            return self[name]
        except (KeyError, ImportError, AttributeError):
            return default


def _namespace(ex: Exercise) -> dict:
    return _Namespace(ex)


def reference_available(ex: Exercise) -> bool:
    """Whether this process can import the exercise's reference (the instructor's, the
    grader's; not a grading sandbox nor a student bundle before the notebook closes)."""
    try:
        ex.reference()
        return True
    except (ImportError, AttributeError):
        return False


GENERIC = [   # tried after an exercise's own diagnoses
    when("the result is cut off from autograd, so no gradient reaches the input: no .detach(), "
         ".item(), numpy or torch.tensor(...) on intermediate results.",
         lambda e: "is missing" in e.problem and "the gradient" in e.problem),
]


def diagnose(ex: Exercise, p: Probe, pd: dict, tensors: dict, got: dict, want: dict,
             problem: str) -> str | None:
    """The message of the first diagnosis (the exercise's own, then the generic ones) that
    recognises this failing probe, or None."""
    e = Evidence(ex, p, pd, tensors, got, want, problem)
    for d in list(ex.diagnose) + GENERIC:
        if d.probes and p.name not in d.probes:
            continue
        try:
            with np.errstate(all="ignore"), torch.random.fork_rng():
                hit = d.test(e)
        except Exception:  # noqa: BLE001 - a diagnosis that does not apply
            hit = False
        if hit:
            try:
                return d.message(e) if callable(d.message) else d.message
            except Exception:  # noqa: BLE001 - a message that cannot be built names nothing
                continue
    return None


def judge(ex: Exercise, run_seed: int, got: dict, want: dict | None = None,
          plan: tuple | None = None) -> dict:
    """{grade_id: Verdict} for every cell the exercise's probes back. A failing probe's
    message names the mistake when a diagnosis recognises it, then says what differs.
    `want` and `plan` (plan, tensors) may come stored (tfscratch.specs.stored: the kernel's
    checks, with no reference at hand); by default they are made from the reference."""
    want = reference_run(ex, run_seed) if want is None else want
    fails: dict[str, list[str]] = {}
    notes: dict[str, list[str]] = {}
    by_name = None
    for p in ex.probes:
        found = {}                    # aspect -> (why, text) or None: one judgement each
        for c in p.cells:
            if c.compares not in found:
                msg = judge_aspect(p, want, got, c.compares)
                found[c.compares] = None
                if msg:
                    if plan is None:
                        plan = build_plan(ex, run_seed)
                    if by_name is None:
                        by_name = {d["name"]: d for d in plan[0]["probes"]}
                    note = _accepted(ex, p, by_name[p.name], plan[1], got, want, msg)
                    if note:
                        notes.setdefault(str(c), []).append(note)
                    else:
                        why = diagnose(ex, p, by_name[p.name], plan[1], got, want, msg)
                        found[c.compares] = (why, f"{p.what or p.name}: {msg}")
            if found[c.compares]:
                fails.setdefault(str(c), []).append(found[c.compares])
    return {c: Verdict(c not in fails, _message(fails.get(c, [])),
                       "" if c in fails else "; ".join(dict.fromkeys(notes.get(c, []))))
            for c in ex.cells()}


def _accepted(ex, p, pd, tensors, got, want, problem) -> str | None:
    """The probe's `accept` note when the student's captures follow another documented form."""
    if p.accept is None or got["meta"].get(f"{p.name}.error"):
        return None
    try:
        with np.errstate(all="ignore"), torch.random.fork_rng():
            return p.accept(Evidence(ex, p, pd, tensors, got, want, problem)) or None
    except Exception:  # noqa: BLE001 - an acceptance that does not apply accepts nothing
        return None


# -- what a cell promises (fair partial credit) ---------------------------------------------

_NOT_SHAPES = (".shapes", ".reduced", ".memory")   # memory properties: their own cells' promise


def judge_aspect(p: Probe, want: dict, got: dict, aspect: str) -> str | None:
    """`judge_probe` for a cell that promises `aspect` (see `shapes` and `batch`)."""
    if aspect == "values":
        return judge_probe(p, want, got)
    msg = judge_probe(p, their_values(p, want, got, memory=aspect == "memory"), got)
    if msg or aspect != "batch":
        return msg
    return _batch_consistency(p, got)


def their_values(p: Probe, want: dict, got: dict, memory: bool = False) -> dict:
    """The reference's captures with the student's own values wherever the shapes agree, cast
    to the reference's dtype: judged against them, a probe can fail only on what the values
    do not decide (an error, a missing output, a shape, a dtype the probe requires, a call
    that must raise, the parameters' names and shapes; with `memory`, the memory keys)."""
    caps = {}
    for key, w in want["caps"].items():
        if not key.startswith(f"{p.name}.") or (key.endswith(_NOT_SHAPES) and not memory):
            continue
        g = got["caps"].get(key)
        if key.endswith((".raised", ".shape") + _NOT_SHAPES) or g is None:
            caps[key] = w
            continue
        w, g = np.asarray(w), np.asarray(g)
        if w.shape != g.shape:
            caps[key] = w
        elif w.dtype == np.bool_ or (w.dtype.kind == "f" and g.dtype.kind in "biuf"):
            with np.errstate(all="ignore"):
                caps[key] = g.astype(w.dtype)
        else:
            caps[key] = g
    return {"caps": caps, "meta": want["meta"]}


def batch_slices(p: Probe) -> list:
    """[(call, earlier call, index)]: the calls on `part(...)` of an earlier call's inputs."""
    first, out = {}, []
    for ci, c in enumerate(p.calls):
        values = list(c.args) + list(c.kwargs.values())
        parts = [v for v in values if isinstance(v, Part)]
        if parts:
            sources = {first[id(v.source)] for v in parts}
            assert len(sources) == 1, f"{p.name}: call {ci} takes parts of several calls"
            out.append((ci, sources.pop(), max((v.index for v in parts), key=len)))
        for v in values:
            if isinstance(v, Input):
                first.setdefault(id(v), ci)
    return out


def _index_text(index: tuple) -> str:
    """(1, 2) -> "[1, 2]", (slice(2, 5),) -> "[2:5]"."""
    return "[" + ", ".join(f"{i.start}:{i.stop}" if isinstance(i, slice) else str(i) for i in index) + "]"


def _batch_consistency(p: Probe, got: dict) -> str | None:
    """The student's result on one element of a batch equals the student's result on the
    whole batch at that element (whatever the values are)."""
    caps = got["caps"]
    for ci, cj, index in batch_slices(p):
        own = f"{p.name}.{ci}.out"
        for key in [k for k in caps if k == own or k.startswith(own + ".")]:
            whole = caps.get(f"{p.name}.{cj}.out" + key[len(own):])
            if whole is None:
                continue
            g, w = np.asarray(caps[key], dtype=np.float64), np.asarray(whole, dtype=np.float64)
            w = w[index] if w.ndim >= len(index) else w
            if g.shape != w.shape or not np.isclose(g, w, atol=p.atol, rtol=p.rtol, equal_nan=True).all():
                at = _index_text(index)
                return (f"{label(key)} (element {at} of call {cj + 1}'s batch, on its own) "
                        f"differs from {label(f'{p.name}.{cj}.out' + key[len(own):])} at {at}: "
                        "each element of a batch must give the same result as on its own, "
                        "whatever the leading axes")
    return None


def _message(found: list) -> str:
    """The named mistakes first (once each), then what differs on each failing probe."""
    if not found:
        return "passed"
    whys = list(dict.fromkeys(w for w, _ in found if w))
    diffs = "\n".join(f"  - {t}" for _, t in found)
    return ("\n".join(whys) + "\n" if whys else "") + "What differs:\n" + diffs


def judge_assignment(assignment: str, run_seed: int, results: dict) -> dict:
    """results: {exercise: {"caps", "meta"}} from the sandbox; returns {grade_id: Verdict}."""
    out = {}
    for ex in specs_for(assignment):
        got = results.get(ex.name) or {"caps": {}, "meta": {
            f"{p.name}.error": "CheckNotRun: the independent check of this exercise did not run "
                               "(the kernel died or the cell timed out before it)"
            for p in ex.probes}}
        out.update(judge(ex, run_seed, got))
    return out


def masked_rows(key, got, want, dead, nan_hint: str) -> str | None:
    """Attention weights whose `dead` query rows (every key masked) may be all zeros or
    uniform, but finite (COURSE_SPEC); the other rows are compared at the default tolerance."""
    g = got.astype(np.float64)
    gd = g[dead]
    if not np.isfinite(gd).all():
        return f"{label(key)} has NaN/inf in a query row whose keys are all masked: {nan_hint}"
    Lk = want.shape[-1]
    ok = (np.abs(gd).max(-1) <= 1e-6) | (np.abs(gd - 1.0 / Lk).max(-1) <= 1e-5)
    if not ok.all():
        return (f"{label(key)}: a query row whose keys are all masked is neither all zeros nor "
                f"uniform (1/Lk): {np.round(gd[~ok][0], 4).tolist()}")
    gl, wl = g[~dead], want[~dead].astype(np.float64)
    if np.isnan(gl).any() or not np.isclose(gl, wl, atol=ATOL, rtol=RTOL).all():
        diff = np.nan_to_num(np.abs(gl - wl), nan=np.inf)
        return (f"{label(key)} differs from the expected values in rows with allowed keys by up "
                f"to {diff.max():.3g} (atol={ATOL:g}, rtol={RTOL:g})")
    return None   # for compare= hooks that fall back to the default on part of a tensor
