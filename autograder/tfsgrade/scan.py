"""Static scan of a submission for shortcuts and tampering (issue 14, item 5).

The coordinator runs this on every submitted notebook before (or beside) grading. It never
executes the student's code: it parses every code cell the student wrote or changed (IPython
syntax is translated first, so `!cmd` and `%run` are seen too) and follows names through
imports, aliases, assignments, `getattr` with strings it can fold (`"soft" + "max"`), star
imports, `sys.modules[...]`, `__dict__[...]`, `exec` of constant strings and helper functions
defined in other cells.

Two verdicts:

* CERTAIN: the exercise's own PyTorch built-in (or the course's own implementation of that
  exercise) is reached from that exercise's solution cell, or the exercise's name is bound to
  one. The coordinator scores that exercise 0 and shows the finding as the reason.
* REVIEW: everything else that a grader should look at (changes to other modules' attributes,
  IPython hooks, torch function modes, exec/eval/compile, ctypes, importlib, sys.modules,
  reading course files, sqlite3, sockets, subprocesses, dynamic lookups the scan cannot
  resolve). It never changes a score; it is listed with cell and line in the report.

Shortcuts are forbidden only inside their own exercise (COURSE_SPEC section 3): `torch.softmax`
in `scaled_dot_product_attention` raises nothing, `nn.LayerNorm` in `EncoderLayer` neither.

Entry points:
    scan_notebook(nb, assignment, *, released=None, source=None) -> ScanResult
    scan_code(code, exercise, assignment="") -> ScanResult      (one cell; for tests and tools)
"""
from __future__ import annotations

import ast
import copy
import importlib
import re
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from .cells import solutions
from .cells import course_texts as _course_texts
from .cells import written as _written
from .cells import meta as _meta
from .cells import source as _src
from .scan_rules import (  # noqa: F401  (CERTAIN, REVIEW, GROUPS, exercise_groups: the scan's API)
    CERTAIN, EXERCISE_ONLY_KINDS, GROUPS, HIDDEN_KINDS, REVIEW, exercise_groups, _ASSIGN_OK, _ATTR_CALLS, _BUILTINS, _CE_LEAVES,
    _CE_LS_POS, _COURSE_PATH, _DANGER, _DANGER_LEAF, _EXEC_CALLS, _FRAME_ATTRS, _HOOK_ATTRS, _MAGICS_FILES,
    _MAGICS_OK, _MAGICS_SUBPROCESS, _OPEN_CALLS, _REEXPORTED, _SHELL_OK, _STAR_INTROSPECT)


@dataclass(frozen=True)
class Finding:
    cell: int             # index in nb.cells
    grade_id: str | None  # nbgrader grade_id of the cell (the exercise's solution cell), if any
    line: int             # 1-based line in the cell's source
    kind: str             # shortcut, reference, tamper, ipython-hook, torch-function-mode, ...
    certainty: str        # CERTAIN or REVIEW
    exercise: str | None  # the exercise it concerns (None: the notebook as a whole)
    message: str
    code: str = ""        # the offending source line

    def where(self) -> str:
        gid = f" ({self.grade_id})" if self.grade_id else ""
        return f"cell {self.cell}{gid}, line {self.line}"

    def describe(self) -> str:
        return f"{self.where()}: {self.message}"


@dataclass
class ScanResult:
    assignment: str
    exercises: list[str]
    findings: list[Finding] = field(default_factory=list)

    @property
    def certain(self) -> list[Finding]:
        return [f for f in self.findings if f.certainty == CERTAIN]

    @property
    def review(self) -> list[Finding]:
        return [f for f in self.findings if f.certainty == REVIEW]

    @property
    def hidden(self) -> list[Finding]:
        """What the scan cannot read, in an exercise's own cells (scan_rules.HIDDEN_KINDS): the
        submission goes to review with these lines."""
        return [f for f in self.review if f.kind in HIDDEN_KINDS and f.exercise]

    def zeroed(self) -> dict[str, str]:
        """exercise -> reason, for every exercise the scan scores 0 (a certain shortcut)."""
        out: dict[str, str] = {}
        for f in self.certain:
            if f.exercise and f.exercise not in out:
                out[f.exercise] = f"shortcut: {f.describe()}"
        return out

    def zeroed_cells(self, owners: dict) -> dict[str, str]:
        """test cell grade_id -> reason, for the graded cells of every zeroed exercise;
        `owners`: {test cell: its exercise}, as the specs declare them (manifest.owners)."""
        zeroed = self.zeroed()
        return {gid: zeroed[ex] for gid, ex in owners.items() if ex in zeroed}

    def notes(self) -> list[str]:
        """One line per finding, for grades.csv and the report."""
        return [("0 points, " if f.certainty == CERTAIN else "flagged for review, ")
                + f"{f.exercise or 'notebook'}: {f.describe()}" for f in self.findings]

    def to_dict(self) -> dict:
        return {"assignment": self.assignment, "exercises": self.exercises,
                "findings": [asdict(f) for f in self.findings]}


# --------------------------------------------------------------------------- helpers
def _ipython_to_python(src: str) -> str:
    """`!ls` -> get_ipython().system('ls'), `%run x` -> get_ipython().run_line_magic(...)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(src)
    except Exception:  # noqa: BLE001 - no IPython, or a cell it cannot transform
        return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln
                         for ln in src.splitlines())


def _leaf(path: str) -> str:
    parts = path.split(".")
    for i in range(len(parts) - 1):
        if parts[i] == "ops" and parts[i - 1] in ("torch", "_ops") and i + 2 < len(parts):
            return parts[i + 2]  # torch.ops.<ns>.<op>[.<overload>]
    return parts[-1]


# Attributes through which a built-in is still called: `nn.MultiheadAttention.forward(m, ...)`,
# `F.softmax.__call__(x)`, `torch.softmax.__wrapped__`.
_CALL_THROUGH = {"__call__", "__wrapped__", "forward", "__func__", "__get__", "_call_impl",
                 "__new__", "__init__", "func", "__self__", "apply", "_forward_impl"}


def _leaves(path: str) -> list[str]:
    """The leaf of `path` and every earlier part that is called through (see _CALL_THROUGH)."""
    parts = path.split(".")
    out = [_leaf(path)]
    for i in range(1, len(parts) - 1):
        if parts[i + 1] in _CALL_THROUGH:
            out.append(parts[i])
    return out


def _danger(path: str):
    for prefix, kind, msg in _DANGER:
        if path == prefix or path.startswith(prefix + "."):
            return kind, msg
    leaf = path.rsplit(".", 1)[-1]
    if path.startswith("tfscratch.") and leaf in _DANGER_LEAF:
        return _DANGER_LEAF[leaf]
    if path.startswith("torch.") and ("torch_function" in path.lower()
                                      or "TorchFunction" in path or "TorchDispatch" in path):
        return "torch-function-mode", "reaches torch function modes (the shortcut guard is one)"
    return None


def _star_names(module: str) -> set[str] | None:
    if not module.startswith(_STAR_INTROSPECT):
        return None
    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001
        return None
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n in dir(mod) if not n.startswith("_")]
    return set(names)


def _b2s(b) -> str:
    return b.decode() if isinstance(b, (bytes, bytearray)) else str(b)


def _decoders():
    import base64
    import binascii
    import codecs
    return {
        "base64.b64decode": lambda s, *a: _b2s(base64.b64decode(s)),
        "base64.standard_b64decode": lambda s, *a: _b2s(base64.standard_b64decode(s)),
        "base64.urlsafe_b64decode": lambda s, *a: _b2s(base64.urlsafe_b64decode(s)),
        "base64.b32decode": lambda s, *a: _b2s(base64.b32decode(s)),
        "base64.b16decode": lambda s, *a: _b2s(base64.b16decode(s)),
        "base64.a85decode": lambda s, *a: _b2s(base64.a85decode(s)),
        "base64.b85decode": lambda s, *a: _b2s(base64.b85decode(s)),
        "binascii.unhexlify": lambda s, *a: _b2s(binascii.unhexlify(s)),
        "binascii.a2b_base64": lambda s, *a: _b2s(binascii.a2b_base64(s)),
        "codecs.decode": lambda s, enc="utf-8", *a: _b2s(codecs.decode(s, enc or "utf-8")),
        "builtins.bytes.fromhex": lambda s, *a: _b2s(bytes.fromhex(s)),
    }


_DECODERS = _decoders()


@dataclass
class _Def:
    name: str
    cell: int
    line: int
    paths: list = field(default_factory=list)   # (path, line) module paths referenced
    users: set = field(default_factory=set)     # user names referenced
    methods: list = field(default_factory=list)  # (attr, line) on unresolved receivers


USER = "@"  # env value prefix for names the student's (or the course's) cells define


class _Cell(ast.NodeVisitor):
    """Visits one cell: resolves names against the notebook-wide environment and records
    findings (for student cells) and definitions (for every cell)."""

    def __init__(self, scanner: "_Scanner", idx: int, grade_id: str | None,
                 exercise: str | None, student: bool, lines: list[str]):
        self.s, self.idx, self.grade_id, self.exercise = scanner, idx, grade_id, exercise
        self.student, self.lines = student, lines
        self.scopes: list[dict] = []
        self.defstack: list[_Def] = []
        self.bound_top: dict[str, int] = {}  # exercise names bound at the cell's top level
        self.groups = exercise_groups(exercise)
        self.line_offset = 0

    # ---------------------------------------------------------------- findings
    def flag(self, node, kind, certainty, message, exercise=None):
        if not self.student:
            return
        line = getattr(node, "lineno", 1) + self.line_offset
        code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        ex = exercise if exercise is not None else self.exercise
        self.s.add(Finding(self.idx, self.grade_id, line, kind, certainty, ex, message, code))

    # ---------------------------------------------------------------- environment
    def lookup(self, name: str):
        for sc in reversed(self.scopes):
            if name in sc:
                return sc[name]
        if name in self.s.env:
            return self.s.env[name]
        if name == "__builtins__":
            return "builtins"
        if name == "get_ipython":
            return "IPython.get_ipython"
        if name in _BUILTINS:
            return f"builtins.{name}"
        return None

    def bind(self, name: str, value, node=None):
        if self.scopes:
            self.scopes[-1][name] = value
            return
        self.s.env[name] = value
        if node is not None and name in self.s.exercises:
            self.bound_top[name] = getattr(node, "lineno", 1)

    def const(self, name: str):
        return self.s.consts.get(name)

    # ---------------------------------------------------------------- folding strings
    def fold(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
            return node.value.decode("latin-1")
        if isinstance(node, ast.Name):
            return self.const(node.id)
        if isinstance(node, ast.JoinedStr):
            out = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    out.append(str(v.value))
                elif isinstance(v, ast.FormattedValue):
                    f = self.fold(v.value)
                    if f is None:
                        return None
                    out.append(f)
                else:
                    return None
            return "".join(out)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.fold(node.left), self.fold(node.right)
            return a + b if a is not None and b is not None else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            a = self.fold(node.left)
            if a is not None and isinstance(node.right, ast.Constant) and isinstance(node.right.value, int):
                return a * node.right.value
            return None
        if isinstance(node, ast.Subscript):
            base = self.fold(node.value)
            sl = node.slice
            if base is None:
                return None
            try:
                if isinstance(sl, ast.Slice):
                    parts = [None if p is None else ast.literal_eval(p)
                             for p in (sl.lower, sl.upper, sl.step)]
                    return base[slice(*parts)]
                return base[ast.literal_eval(sl)]
            except Exception:  # noqa: BLE001
                return None
        if isinstance(node, ast.Call):
            return self._fold_call(node)
        return None

    def _fold_seq(self, node):
        if isinstance(node, (ast.List, ast.Tuple)):
            parts = [self.fold(e) for e in node.elts]
            return None if any(p is None for p in parts) else parts
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "reversed" and node.args:
                s = self.fold(node.args[0])
                return None if s is None else list(reversed(s))
            if node.func.id == "map" and len(node.args) == 2 and \
                    isinstance(node.args[0], ast.Name) and node.args[0].id == "chr":
                try:
                    return [chr(i) for i in ast.literal_eval(node.args[1])]
                except Exception:  # noqa: BLE001
                    return None
            if node.func.id in ("list", "tuple") and node.args:
                return self._fold_seq(node.args[0])
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            return None
        s = self.fold(node)
        return None if s is None else list(s)

    def _fold_call(self, node: ast.Call):
        f = node.func
        if isinstance(f, ast.Name) and f.id == "chr" and node.args:
            try:
                return chr(ast.literal_eval(node.args[0]))
            except Exception:  # noqa: BLE001
                return None
        if isinstance(f, ast.Name) and f.id == "str" and node.args:
            return self.fold(node.args[0])
        fpath = self.resolve(f)
        if fpath in _DECODERS and node.args:
            arg = self.fold(node.args[0])
            if arg is None:
                return None
            try:
                return _DECODERS[fpath](arg, *[self.fold(a) for a in node.args[1:]])
            except Exception:  # noqa: BLE001
                return None
        if not isinstance(f, ast.Attribute):
            return None
        if f.attr == "encode" and not node.args:
            return self.fold(f.value)
        if f.attr == "decode":  # folded bytes are kept as text
            return self.fold(f.value)
        base = self.fold(f.value)
        if base is None:
            return None
        args = [self.fold(a) for a in node.args]
        try:
            if f.attr == "join" and node.args:
                seq = self._fold_seq(node.args[0])
                return None if seq is None else base.join(seq)
            if f.attr in ("lower", "upper", "strip", "lstrip", "rstrip", "title",
                          "capitalize", "swapcase", "casefold") and not node.args:
                return getattr(base, f.attr)()
            if f.attr == "replace" and len(args) == 2 and None not in args:
                return base.replace(*args)
            if f.attr == "format" and None not in args:
                return base.format(*args)
        except Exception:  # noqa: BLE001
            return None
        return None

    # ---------------------------------------------------------------- resolving expressions
    def resolve(self, node):
        """A dotted path ('torch.nn.functional.softmax'), USER+name, or None."""
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if base and not base.startswith(USER):
                # a module that a standard-library module imported, reached through it: os.sys
                # is sys (torch.signal and scipy.signal are not the signal module)
                if node.attr.lstrip("_") in _REEXPORTED and base.split(".")[0] in sys.stdlib_module_names:
                    return node.attr.lstrip("_")
                return f"{base}.{node.attr}"
            return None
        if isinstance(node, ast.Subscript):
            return self._resolve_subscript(node)
        if isinstance(node, ast.Call):
            return self._resolve_call(node)
        return None

    def _resolve_subscript(self, node: ast.Subscript):
        key = self.fold(node.slice)
        v = node.value
        # sys.modules["torch"], X.__dict__["softmax"], vars(X)["softmax"], __builtins__["eval"]
        if isinstance(v, ast.Attribute) and v.attr == "__dict__":
            base = self.resolve(v.value)
            return f"{base}.{key}" if base and key and not base.startswith(USER) else None
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "vars" \
                and v.args:
            base = self.resolve(v.args[0])
            return f"{base}.{key}" if base and key and not base.startswith(USER) else None
        base = self.resolve(v)
        if base == "sys.modules" and key:
            return key
        if base == "builtins" and key:
            return f"builtins.{key}"
        if base == "builtins.globals()" and key:
            return self.lookup(key)
        return None

    def _resolve_call(self, node: ast.Call):
        fpath = self.resolve(node.func)
        if fpath is None:
            # operator.attrgetter("softmax")(torch)
            if isinstance(node.func, ast.Call):
                inner = self.resolve(node.func.func)
                if inner == "operator.attrgetter" and node.func.args and node.args:
                    name, base = self.fold(node.func.args[0]), self.resolve(node.args[0])
                    if name and base and not base.startswith(USER):
                        return f"{base}.{name}"
            return None
        if fpath in ("builtins.getattr", "inspect.getattr_static") and len(node.args) >= 2:
            base, name = self.resolve(node.args[0]), self.fold(node.args[1])
            if base and name and not base.startswith(USER):
                return f"{base}.{name}"
            return None
        if fpath.endswith(".__getattribute__") and node.args:
            name = self.fold(node.args[-1])
            recv = fpath[: -len(".__getattribute__")]
            if len(node.args) == 2:
                recv = self.resolve(node.args[0])
            return f"{recv}.{name}" if recv and name and not recv.startswith(USER) else None
        if fpath.endswith(".__dict__.get") and node.args:
            name = self.fold(node.args[0])
            return f"{fpath[: -len('.__dict__.get')]}.{name}" if name else None
        if fpath in ("importlib.import_module", "builtins.__import__") and node.args:
            name = self.fold(node.args[0])
            if name and fpath == "builtins.__import__" and not any(
                    k.arg == "fromlist" for k in node.keywords) and len(node.args) < 4:
                name = name.split(".")[0]
            return name
        if fpath in ("sys.modules.get", "sys.modules.__getitem__") and node.args:
            return self.fold(node.args[0])
        if fpath == "IPython.get_ipython":
            return "IPython.shell"
        if fpath in ("tfscratch.checks.notebook", "tfscratch.checks.kernel.notebook"):
            return "tfscratch.checks"      # chk = checks.notebook("NN"): the course's checks
        if fpath == "builtins.globals":
            return "builtins.globals()"
        return None

    # ---------------------------------------------------------------- checks on a resolved path
    def check_path(self, node, path: str, *, tensor_receiver=False):
        if not path or path.startswith(USER):
            return
        if self.defstack:
            self.defstack[-1].paths.append((path, getattr(node, "lineno", 1) + self.line_offset))
        if self.exercise:
            self._check_exercise_path(node, path, self.exercise, self.groups)
        d = _danger(path)
        if d:
            self.flag(node, d[0], REVIEW, f"{d[1]}: `{path}`")
        elif path.startswith("IPython.shell."):
            attr = path.split(".")[2]
            if attr in ("system", "getoutput"):
                self.flag(node, "subprocess", REVIEW, "runs a shell command through IPython (`!`)")
            elif attr not in _SHELL_OK:
                self.flag(node, "ipython-hook", REVIEW,
                          f"changes or reaches the IPython shell: `get_ipython().{attr}`")
        elif path.startswith("tfscratch.fallback.pick") and self.exercise:
            self.flag(node, "reference", REVIEW,
                      "uses tfscratch.fallback.pick, which returns the course's reference version")

    def _check_exercise_path(self, node, path, exercise, groups, via=""):
        leaf = _leaf(path)
        leaves = _leaves(path)
        # the course's own package is built from scratch: its `scaled_dot_product_attention`
        # is notebook 01's exercise, not PyTorch's built-in; only the same exercise counts
        for g in (groups if not path.startswith("tfscratch.") else ()):
            spec = GROUPS[g]
            if spec.get("roots") and path.split(".")[0] not in spec["roots"]:
                continue  # e.g. the student's own `AdamW`, not torch.optim's
            if any(x in spec["leaves"] for x in leaves) or set(path.split(".")) & spec.get("modules", set()):
                self.flag(node, "shortcut", CERTAIN,
                          f"`{exercise}` uses PyTorch's built-in `{path}`{via}; this exercise "
                          f"forbids {spec['label']}", exercise)
                return
            if leaf in spec["review"]:
                self.flag(node, "shortcut", REVIEW,
                          f"`{exercise}` uses `{path}`{via}, which can compute the forbidden "
                          f"{spec['label']}", exercise)
                return
        if path.startswith("tfscratch."):
            if leaf == exercise:
                self.flag(node, "reference", CERTAIN,
                          f"`{exercise}` uses the course's own implementation `{path}`{via}",
                          exercise)
            elif leaf in self.s.exercises and not via:
                self.flag(node, "reference", REVIEW,
                          f"`{exercise}` uses the course's reference `{path}`, an exercise of "
                          f"this notebook", exercise)
            elif path in ("tfscratch.reference", "tfscratch") and not via:
                pass  # the module object itself; its attributes are checked where used
        elif groups and not via and (path.startswith(("torch._C", "torch._VF", "torch._ops"))
                                     or ".ops." in path or path == "torch.ops"):
            self.flag(node, "shortcut", REVIEW,
                      f"`{exercise}` reaches PyTorch internals `{path}`", exercise)

    def check_method(self, node: ast.Attribute):
        """`x.softmax(...)` on something the scan cannot resolve: a Tensor method."""
        if self.defstack:
            self.defstack[-1].methods.append((node.attr, node.lineno + self.line_offset))
        if not self.exercise:
            return
        self._check_method(node, node.attr, self.exercise, self.groups, node.value)

    def _check_method(self, node, attr, exercise, groups, receiver=None, via=""):
        selfish = isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")
        for g in groups:
            spec = GROUPS[g]
            if attr in spec["tensor_methods"] and not selfish:
                self.flag(node, "shortcut", CERTAIN,
                          f"`{exercise}` calls the Tensor method `.{attr}`{via}; this exercise "
                          f"forbids {spec['label']}", exercise)
                return
            if attr in spec["leaves"] or attr in spec["tensor_methods"]:
                self.flag(node, "shortcut", REVIEW,
                          f"`{exercise}` uses an attribute named `{attr}`{via} on an object the "
                          f"scan cannot resolve ({spec['label']} is forbidden here)", exercise)
                return

    # ---------------------------------------------------------------- visitors
    def visit_Import(self, node: ast.Import):
        for a in node.names:
            if a.asname:
                self.bind(a.asname, a.name, node)
            else:
                top = a.name.split(".")[0]
                self.bind(top, top, node)
            self.check_path(node, a.name)

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.level or not node.module:
            return
        for a in node.names:
            if a.name == "*":
                names = _star_names(node.module)
                self.check_path(node, node.module)
                if names is None:
                    continue
                for n in names:
                    self.bind(n, f"{node.module}.{n}", node)
                if self.exercise and self.exercise in names:
                    self.check_path(node, f"{node.module}.{self.exercise}")
                continue
            path = f"{node.module}.{a.name}"
            self.bind(a.asname or a.name, path, node)
            self.check_path(node, path)

    def _visit_function(self, node):
        top = not self.scopes
        d = _Def(node.name, self.idx, node.lineno) if top else None
        for dec in node.decorator_list:
            self.visit(dec)
        for default in node.args.defaults + [x for x in node.args.kw_defaults if x]:
            self.visit(default)
        if d:
            self.defstack.append(d)
        scope = {}
        for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            scope[a.arg] = None
        for a in (node.args.vararg, node.args.kwarg):
            if a:
                scope[a.arg] = None
        self._body(node, scope, d)

    visit_FunctionDef = visit_AsyncFunctionDef = _visit_function

    def _body(self, node, scope: dict, d) -> None:
        """A def's or a class's body, visited in its own scope; then its name is bound (and a
        top-level one recorded with what it reads)."""
        self.scopes.append(scope)
        for st in node.body:
            self.visit(st)
        self.scopes.pop()
        if d:
            self.defstack.pop()
            self.s.defs[node.name] = d
        self.bind(node.name, USER + node.name, node)

    def visit_Lambda(self, node: ast.Lambda):
        for default in node.args.defaults:
            self.visit(default)
        self.scopes.append({a.arg: None for a in node.args.args + node.args.kwonlyargs})
        self.visit(node.body)
        self.scopes.pop()

    def visit_ClassDef(self, node: ast.ClassDef):
        top = not self.scopes
        d = _Def(node.name, self.idx, node.lineno) if top else None
        if d:
            self.defstack.append(d)
        for b in node.bases + [k.value for k in node.keywords] + node.decorator_list:
            self.visit(b)
        self._body(node, {}, d)

    def visit_Name(self, node: ast.Name):
        if isinstance(node.ctx, ast.Load):
            v = self.lookup(node.id)
            if v and v.startswith(USER):
                if self.defstack:
                    self.defstack[-1].users.add(v[1:])
                self.s.uses.setdefault(self.idx, []).append((v[1:], node.lineno + self.line_offset))
            elif v and not v.startswith("builtins.") or v in (
                    "builtins.__import__", "builtins.exec", "builtins.eval", "builtins.compile",
                    "builtins.globals"):
                self.check_path(node, v)

    def visit_Attribute(self, node: ast.Attribute):
        if node.attr in _FRAME_ATTRS:
            self.flag(node, "introspection", REVIEW, f"reads a running frame (`.{node.attr}`)")
        path = self.resolve(node)
        if path:
            if not path.startswith(USER):
                self.check_path(node, path)
            # a chain of names: its parts are covered by the full path
            v = node.value
            while isinstance(v, ast.Attribute):
                v = v.value
            if isinstance(v, (ast.Name,)):
                return
            self.visit(node.value)
            return
        self.check_method(node)
        if isinstance(node.ctx, ast.Store) and node.attr in _HOOK_ATTRS:
            self.flag(node, "tamper", REVIEW, f"sets `.{node.attr}` on an object")
        self.visit(node.value)

    def visit_Subscript(self, node: ast.Subscript):
        path = self._resolve_subscript(node)
        if path:
            self.check_path(node, path)
        elif self.exercise and isinstance(node.ctx, ast.Load):
            v = node.value
            dict_of = (isinstance(v, ast.Attribute) and v.attr == "__dict__") or (
                isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "vars")
            key = self.fold(node.slice) if dict_of else None
            if key:
                self._check_method(node, key, self.exercise, self.groups,
                                   via=f" (through a namespace lookup of {key!r})")
            elif self._namespace(v) and self.fold(node.slice) is None:
                # builtins.__dict__[name], vars(torch)[name], sys.modules[name], globals()[name]
                # with a name computed at run time: whatever it calls, the scan cannot tell
                self.flag(node, "dynamic-lookup", REVIEW,
                          "looks a name up in a module's namespace by a key computed at run time")
        self.generic_visit(node)

    def _namespace(self, v) -> bool:
        """A module's (or the interpreter's) namespace: X.__dict__ or vars(X) of a module, the
        builtins, sys.modules, globals()."""
        if (isinstance(v, ast.Attribute) and v.attr == "__dict__") or (
                isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "vars" and v.args):
            base = self.resolve(v.value if isinstance(v, ast.Attribute) else v.args[0])
            return bool(base) and not base.startswith(USER)
        return self.resolve(v) in ("builtins", "sys.modules", "builtins.globals()", "builtins.__builtins__")

    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, str) and self.student and _COURSE_PATH.search(node.value):
            self.flag(node, "course-files", REVIEW,
                      f"mentions a course or grading path: {node.value[:80]!r}")

    def visit_Call(self, node: ast.Call):
        fpath = self.resolve(node.func)
        self._check_call(node, fpath)
        path = self._resolve_call(node)
        if path and path not in ("IPython.shell", "builtins.globals()"):
            self.check_path(node, path)
        self.generic_visit(node)

    def _check_call(self, node: ast.Call, fpath):
        args = node.args
        if self.exercise and (fpath in _DECODERS or fpath == "codecs.encode") and args \
                and self.fold(args[0]) is None:
            # codecs.decode(f.__doc__, "rot13"), base64 of a computed string: text turned into
            # other text at run time, which the scan never sees (constant inputs are folded)
            self.flag(node, "hidden-code", REVIEW, f"decodes text computed at run time ({fpath})")
        if fpath == "builtins.object.__getattribute__":
            fpath = "builtins.getattr"
        if fpath in _ATTR_CALLS and len(args) >= 2:
            self._check_attr_call(node, fpath)
        elif self._check_indirect_method(node, fpath):
            pass
        elif fpath in _EXEC_CALLS and args:
            code = self.fold(args[0])
            if code is not None:
                self._visit_string_code(node, code)
        elif fpath in _OPEN_CALLS and args:
            p = self.fold(args[0])
            if p is None:
                self.flag(node, "file-access", REVIEW, "opens a file whose path is computed")
            elif p.startswith(("/", "~")) or re.match(r"^[A-Za-z]:\\", p):
                self.flag(node, "file-access", REVIEW, f"opens a file outside the notebook's folder: {p!r}")
        elif fpath in ("IPython.shell.run_line_magic", "IPython.shell.run_cell_magic") and args:
            self._check_magic(node)
        elif fpath and fpath.endswith((".__dict__.update", ".__dict__.pop", ".__dict__.clear",
                                       ".__dict__.setdefault", ".__dict__.__setitem__")):
            base = fpath.rsplit(".__dict__.", 1)[0]
            self.flag(node, "tamper", REVIEW, f"changes the namespace of `{base}`")
        elif fpath == "builtins.globals().update" or (
                isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                and isinstance(node.func.value, ast.Call)
                and self.resolve(node.func.value.func) == "builtins.globals"):
            self.flag(node, "tamper", REVIEW, "rebinds names through globals().update")
        if self.exercise and any(GROUPS[g]["call_rule"] == "label_smoothing" for g in self.groups) and fpath:
            self._check_label_smoothing(node, fpath)

    def _check_attr_call(self, node: ast.Call, fpath: str):
        """getattr / hasattr / setattr / delattr (and inspect.getattr_static)."""
        args = node.args
        base = self.resolve(args[0])
        name = self.fold(args[1])
        modular = base and not base.startswith(USER) and not base.startswith("builtins.globals")
        if fpath in ("builtins.setattr", "builtins.delattr"):
            if modular and not base.startswith(_ASSIGN_OK):
                self.flag(node, "tamper", REVIEW,
                          f"changes an attribute of `{base}` with {fpath.split('.')[-1]}")
            elif name in _HOOK_ATTRS:
                self.flag(node, "tamper", REVIEW, f"sets `{name}` with setattr")
        elif name is None and modular:
            self.flag(node, "dynamic-lookup", REVIEW,
                      f"looks up a computed attribute name on `{base}`")
        elif name is None and self.groups and fpath != "builtins.hasattr" and not (
                isinstance(args[0], ast.Name) and args[0].id in ("self", "cls")):
            self.flag(node, "dynamic-lookup", REVIEW,
                      f"`{self.exercise}` looks up a computed attribute name with getattr",
                      self.exercise)
        elif name is not None and not modular and self.exercise:
            self._check_method(node, name, self.exercise, self.groups, args[0],
                               via=f" (through getattr(..., {name!r}))")

    def _check_indirect_method(self, node: ast.Call, fpath) -> bool:
        """A method called by name: operator.attrgetter(n)(x), x.__getattribute__(n),
        operator.methodcaller(n). True when the call is one of these."""
        args, name, receiver, how = node.args, None, None, None
        if fpath is None and isinstance(node.func, ast.Call) and self.exercise and \
                self.resolve(node.func.func) == "operator.attrgetter" and node.func.args:
            name, how = self.fold(node.func.args[0]), "operator.attrgetter"
            name = name and name.split(".")[-1]
            shown = self.fold(node.func.args[0])
        elif fpath is None and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "__getattribute__" and args and self.exercise:
            name, how, receiver = self.fold(args[-1]), "__getattribute__", node.func.value
            shown = name
        elif fpath == "operator.methodcaller" and args and self.exercise:
            name, how = self.fold(args[0]), "operator.methodcaller"
            shown = name
        else:
            return False
        if name:
            self._check_method(node, name, self.exercise, self.groups, receiver,
                               via=f" (through {how}({shown!r}))")
        return True

    def _check_magic(self, node: ast.Call):
        args = node.args
        magic = (self.fold(args[0]) or "").lstrip("%")
        line = self.fold(args[1]) if len(args) > 1 else ""
        if magic in _MAGICS_SUBPROCESS:
            self.flag(node, "subprocess", REVIEW, f"runs a shell command through %{magic}")
        elif magic in _MAGICS_FILES:
            self.flag(node, "file-access", REVIEW, f"runs or loads files through %{magic} {line or ''}".strip())
        elif magic == "load_ext" and (line or "").strip() != "autoreload":
            self.flag(node, "ipython-hook", REVIEW, f"loads an IPython extension: {line!r}")
        elif magic not in _MAGICS_OK:
            self.flag(node, "ipython-hook", REVIEW, f"uses the magic %{magic}")

    def _check_label_smoothing(self, node: ast.Call, fpath: str):
        leaf = _leaf(fpath)
        if leaf not in _CE_LEAVES or fpath.startswith(USER):
            return
        has = any(k.arg == "label_smoothing" for k in node.keywords)
        has = has or len(node.args) > _CE_LS_POS.get(leaf, 99)
        dyn = [k for k in node.keywords if k.arg is None]
        for k in dyn:
            if isinstance(k.value, ast.Dict):
                has = has or any(self.fold(key) == "label_smoothing" for key in k.value.keys if key)
            elif isinstance(k.value, ast.Call) and isinstance(k.value.func, ast.Name) \
                    and k.value.func.id == "dict":
                has = has or any(kw.arg == "label_smoothing" for kw in k.value.keywords)
        if has:
            self.flag(node, "shortcut", CERTAIN,
                      f"`{self.exercise}` calls `{fpath}` with label_smoothing: the exercise asks "
                      "you to build the smoothing yourself")
        elif dyn:
            self.flag(node, "shortcut", REVIEW,
                      f"`{self.exercise}` calls `{fpath}` with **kwargs the scan cannot read "
                      "(label_smoothing would be the forbidden shortcut)")

    def _visit_string_code(self, node, code: str):
        try:
            tree = ast.parse(_ipython_to_python(code))
        except SyntaxError:
            return
        saved = self.line_offset
        self.line_offset = getattr(node, "lineno", 1) - 1 + saved
        try:
            for st in tree.body:
                # line numbers inside the string all map to the exec call's line
                for n in ast.walk(st):
                    if hasattr(n, "lineno"):
                        n.lineno = 1
                self.visit(st)
        finally:
            self.line_offset = saved

    def _target(self, t, value, node):
        """Bind or check one assignment target."""
        if isinstance(t, ast.Name):
            v = self.resolve(value) if value is not None else None
            if v is None and isinstance(value, ast.Lambda):
                v = USER + t.id
            self.bind(t.id, v, node)
            if not self.scopes and value is not None:
                s = self.fold(value)
                if s is not None:
                    self.s.consts[t.id] = s
                else:
                    self.s.consts.pop(t.id, None)
            elif value is not None:
                s = self.fold(value)
                if s is not None:
                    self.s.consts[t.id] = s
            if t.id == "__builtins__":
                self.flag(node, "tamper", REVIEW, "rebinds __builtins__")
        elif isinstance(t, (ast.Tuple, ast.List)):
            vals = value.elts if isinstance(value, (ast.Tuple, ast.List)) and \
                len(value.elts) == len(t.elts) else [None] * len(t.elts)
            for sub, val in zip(t.elts, vals):
                self._target(sub, val, node)
        elif isinstance(t, ast.Starred):
            self._target(t.value, None, node)
        elif isinstance(t, ast.Attribute):
            base = self.resolve(t.value)
            if base and not base.startswith(USER):
                if base == "IPython.shell" or base.startswith("IPython.shell."):
                    self.flag(t, "ipython-hook", REVIEW, f"changes the IPython shell: `.{t.attr}`")
                elif not f"{base}.{t.attr}".startswith(_ASSIGN_OK):
                    self.flag(t, "tamper", REVIEW,
                              f"changes another module's attribute `{base}.{t.attr}`")
            elif t.attr in _HOOK_ATTRS:
                self.flag(t, "tamper", REVIEW, f"sets `.{t.attr}` on an object")
            self.visit(t.value)
        elif isinstance(t, ast.Subscript):
            v = t.value
            key = self.fold(t.slice)
            if isinstance(v, ast.Attribute) and v.attr == "__dict__":
                base = self.resolve(v.value)
                if base and not base.startswith(USER):
                    self.flag(t, "tamper", REVIEW, f"changes the namespace of `{base}`")
            elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "vars":
                self.flag(t, "tamper", REVIEW, "changes a namespace through vars()")
            else:
                base = self.resolve(v)
                if base == "builtins.globals()" and key:
                    self._target(ast.Name(id=key, ctx=ast.Store()), value, node)
                    self.flag(t, "tamper", REVIEW, f"binds `{key}` through globals()")
                elif base == "builtins.globals()":
                    self.flag(t, "tamper", REVIEW, "binds a computed name through globals()")
                elif base in ("sys.modules", "builtins"):
                    self.flag(t, "tamper", REVIEW, f"changes `{base}`")
                elif base in ("os.environ",):
                    self.flag(t, "environment", REVIEW, "changes the environment")
            self.visit(t)

    def visit_Assign(self, node: ast.Assign):
        self.visit(node.value)
        for t in node.targets:
            self._target(t, node.value, node)

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if node.value is not None:
            self.visit(node.value)
        self._target(node.target, node.value, node)

    def visit_AugAssign(self, node: ast.AugAssign):
        self.visit(node.value)
        self._target(node.target, None, node)

    def visit_NamedExpr(self, node: ast.NamedExpr):
        self.visit(node.value)
        self._target(node.target, node.value, node)

    def visit_Delete(self, node: ast.Delete):
        for t in node.targets:
            if isinstance(t, (ast.Attribute, ast.Subscript)):
                self._target(t, None, node)
            elif isinstance(t, ast.Name) and not self.scopes:
                self.s.env.pop(t.id, None)

    def visit_For(self, node):
        self.visit(node.iter)
        self._target(node.target, None, node)
        for st in node.body + node.orelse:
            self.visit(st)

    visit_AsyncFor = visit_For

    def visit_With(self, node):
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self._target(item.optional_vars, None, node)
        for st in node.body:
            self.visit(st)

    visit_AsyncWith = visit_With

    def visit_Global(self, node):
        pass


class _Scanner:
    def __init__(self, assignment: str, exercises: list[str]):
        self.assignment = assignment
        self.exercises = list(exercises)
        self.env: dict[str, str | None] = {}
        self.consts: dict[str, str] = {}
        self.defs: dict[str, _Def] = {}
        self.uses: dict[int, list] = {}   # cell -> [(user name, line)]
        self.findings: list[Finding] = []
        self._seen: set = set()
        self.ex_cell: dict[str, int] = {}  # exercise -> index of its solution cell
        self.student_cells: set[int] = set()

    def add(self, f: Finding):
        if f.kind in EXERCISE_ONLY_KINDS and f.exercise is None:
            return
        key = (f.cell, f.line, f.kind, f.certainty, f.exercise, f.message)
        if key not in self._seen:
            self._seen.add(key)
            self.findings.append(f)

    def run_cell(self, idx, source, grade_id, exercise, student):
        src = _ipython_to_python(source)
        try:
            tree = ast.parse(src)
        except SyntaxError:
            return None  # the kernel cannot run it either
        except (RecursionError, MemoryError, ValueError) as e:
            if student:
                self.add(Finding(idx, grade_id, 1, "scan-error", REVIEW, exercise,
                                 f"the scan could not parse this cell ({type(e).__name__})"))
            return None
        v = _Cell(self, idx, grade_id, exercise, student, src.splitlines())
        if student:
            self.student_cells.add(idx)
        try:
            for st in tree.body:
                v.visit(st)
            if student:
                self._check_bindings(v)
        except (RecursionError, MemoryError) as e:  # absurdly deep code: say so, go on
            if student:
                self.add(Finding(idx, grade_id, 1, "scan-error", REVIEW, exercise,
                                 f"the scan could not analyse this cell ({type(e).__name__})"))
        return v

    def outside_definitions(self, lines_by_cell):
        """An exercise whose final definition lives in another student cell (its solution cell
        emptied or its metadata changed) is judged there, with that exercise's rules."""
        for ex in self.exercises:
            idx = self.ex_cell.get(ex, -1)
            d = self.defs.get(ex)
            if not d or d.cell == idx or d.cell not in self.student_cells:
                continue
            groups = exercise_groups(ex)
            v = _Cell(self, d.cell, None, ex, True, lines_by_cell.get(d.cell, []))
            via = " (in its definition outside its own cell)"
            for path, line in d.paths:
                v._check_exercise_path(ast.Name(id=ex, lineno=line), path, ex, groups, via=via)
            for attr, line in d.methods:
                v._check_method(ast.Name(id=ex, lineno=line), attr, ex, groups, via=via)

    def _check_bindings(self, v: _Cell):
        """Exercise names bound at a cell's top level: to a shortcut or the course's own
        implementation (certain), or outside their own cell (review)."""
        for name, line in v.bound_top.items():
            val = self.env.get(name)
            own = v.exercise == name
            if not own and v.idx < self.ex_cell.get(name, -1):
                continue  # the exercise's own cell, further down, defines it again
            if val == USER + name and own:
                continue  # the exercise's own def/class
            node = ast.Name(id=name, lineno=line)
            if val and not val.startswith(USER):
                leaf = _leaf(val)
                groups = exercise_groups(name) if not val.startswith("tfscratch.") else ()
                if any(leaf in GROUPS[g]["leaves"] for g in groups) or (
                        val.startswith("tfscratch.") and leaf == name):
                    kind = "reference" if val.startswith("tfscratch.") else "shortcut"
                    v.flag(node, kind, CERTAIN, f"the exercise `{name}` is bound to `{val}`",
                           exercise=name)
                    continue
                if own:
                    v.flag(node, "redefinition", REVIEW,
                           f"the exercise `{name}` is bound to `{val}`, not defined", exercise=name)
                    continue
            if not own:
                v.flag(node, "redefinition", REVIEW,
                       f"the exercise `{name}` is redefined outside its own cell", exercise=name)

    def transitive(self, ex_cells: list[tuple[int, str | None, str]], lines_by_cell):
        """Shortcuts reached from an exercise's cell through helpers defined elsewhere."""
        for idx, gid, exercise in ex_cells:
            groups = exercise_groups(exercise)
            seen, todo = {exercise}, []
            for name, line in self.uses.get(idx, []):
                d = self.defs.get(name)
                if d and d.cell != idx and name not in seen:
                    seen.add(name)
                    todo.append((name, line, name))
            while todo:
                name, line, chain = todo.pop()
                d = self.defs[name]
                v = _Cell(self, idx, gid, exercise, True, lines_by_cell.get(idx, []))
                node = ast.Name(id=name, lineno=line)
                via = f" through `{chain}` (defined in cell {d.cell})"
                for path, _ in d.paths:
                    if groups or path.startswith("tfscratch."):
                        v._check_exercise_path(node, path, exercise, groups, via=via)
                for attr, _ in d.methods:
                    v._check_method(node, attr, exercise, groups, via=via)
                for u in d.users:
                    if u not in seen and u in self.defs and self.defs[u].cell != idx:
                        seen.add(u)
                        todo.append((u, line, f"{chain} -> {u}"))


# --------------------------------------------------------------------------- entry points
def _course_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _read(path: Path):
    if not path.exists():
        return None
    return _read_cached(str(path), path.stat().st_mtime_ns)


@lru_cache(maxsize=32)
def _read_cached(path: str, mtime_ns: int):
    import nbformat
    return nbformat.read(path, as_version=4)


def scan_notebook(nb, assignment: str, *, released=None, source=None) -> ScanResult:
    """Scan a submitted notebook (an nbformat NotebookNode, any version) of `assignment`.

    `released` is the student notebook the course handed out and `source` the instructor's
    notebook (default: notebooks/<assignment>.ipynb and solutions/<assignment>.ipynb of this
    course). Their code cells, unchanged, are the course's and raise no finding (they still
    define names); every solution cell and every other cell the student wrote or changed is
    scanned. Returns a ScanResult; `result.zeroed()` lists the exercises to score 0.
    """
    import nbformat
    if nb.get("nbformat", 4) < 4:
        nb = nbformat.convert(copy.deepcopy(nb), 4)
    root = _course_root()
    if released is None:
        released = _read(root / "notebooks" / f"{assignment}.ipynb")
    if source is None:
        source = _read(root / "solutions" / f"{assignment}.ipynb")
    course = _course_texts(released, source)
    exercises = list(solutions(released) or solutions(source) or solutions(nb))
    sc = _Scanner(assignment, exercises)
    for idx, c in enumerate(nb.cells):
        gid = _meta(c).get("grade_id")
        if c.get("cell_type") == "code" and isinstance(gid, str) and gid in exercises \
                and _meta(c).get("solution"):
            sc.ex_cell.setdefault(gid, idx)
    last_test = _last_tests(nb, assignment)
    ex_cells, lines = [], {}
    for idx, c in enumerate(nb.cells):
        if c.get("cell_type") != "code":
            continue
        meta = _meta(c)
        gid = meta.get("grade_id") if isinstance(meta.get("grade_id"), str) else None
        is_solution = bool(meta.get("solution")) and gid in exercises
        student = is_solution or _written(_src(c), course) or _rebinds_early(_src(c), idx, last_test)
        exercise = gid if is_solution else None
        v = sc.run_cell(idx, _src(c), gid, exercise, student)
        if v is not None:
            lines[idx] = v.lines
        if exercise:
            ex_cells.append((idx, gid, exercise))
    sc.transitive(ex_cells, lines)
    sc.outside_definitions(lines)
    sc.findings.sort(key=lambda f: (f.cell, f.line, f.certainty != CERTAIN))
    return ScanResult(assignment, exercises, sc.findings)


def _last_tests(nb, assignment: str) -> dict[str, int]:
    """{exercise: the index of its last graded test cell in this notebook}."""
    from .manifest import owners
    own, last = owners(assignment), {}
    for idx, c in enumerate(nb.cells):
        ex = own.get(_meta(c).get("grade_id")) if isinstance(_meta(c).get("grade_id"), str) else None
        if ex is not None:
            last[ex] = idx
    return last


def _rebinds_early(src: str, idx: int, last_test: dict[str, int]) -> bool:
    """A course cell (by its text) that binds an exercise's name before that exercise's last
    test cell: the student moved it there (10's wrapper of flash_attention, pasted above the
    exercise's checks, would make the probe grade the course's wrapper around names the
    student binds in free cells). Scanned as the student's, so its bindings are seen."""
    if not any(name in src for name, last in last_test.items() if idx < last):
        return False        # names no exercise still to be checked: nothing to parse
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return False
    bound = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    bound |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return any(idx < last_test[name] for name in bound if name in last_test)


def scan_code(code: str, exercise: str | None, assignment: str = "",
              setup: str = "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n",
              exercises: list[str] | None = None) -> ScanResult:
    """Scan one cell's code as the solution cell of `exercise` (None: a free cell), after a
    setup cell with the usual imports. For tests and quick checks."""
    exs = exercises if exercises is not None else ([exercise] if exercise else [])
    sc = _Scanner(assignment, exs)
    sc.run_cell(0, setup, "setup_imports", None, False)
    v = sc.run_cell(1, code, exercise, exercise, True)
    if exercise:
        sc.transitive([(1, exercise, exercise)], {1: v.lines if v else []})
    return ScanResult(assignment, exs, sc.findings)
