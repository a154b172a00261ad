"""The scan's rules, as tables (a table to extend): the shortcut groups each exercise forbids
(`GROUPS`, `exercise_groups`), what is flagged for review (`_DANGER`, the IPython hooks and
magics), and the patterns the visitor in tfsgrade.scan uses. Imports nothing of tfsgrade."""
from __future__ import annotations

import re

from tfscratch.shortcuts import GROUPS as _ROWS
from tfscratch.shortcuts import scan_groups as _scan_groups

CERTAIN = "certain"
REVIEW = "review"

# --------------------------------------------------------------------------- the shortcut table
# The scan's columns of the one shortcut table (tfscratch.shortcuts), keyed by group; which
# groups an exercise forbids is its spec's `shortcuts=` (exercise_groups), nowhere else.
GROUPS: dict[str, dict] = {
    g: dict(label=r.label, leaves=set(r.leaves), tensor_methods=set(r.tensor_methods),
            review=set(r.review), roots=r.roots, modules=set(r.modules), call_rule=r.call_rule)
    for g, r in _ROWS.items()}


def exercise_groups(exercise: str | None) -> tuple[str, ...]:
    """The groups the scan checks inside `exercise` (a solution cell's grade_id): its spec's
    `shortcuts=`, one per distinct scan rule. Exercises without a spec forbid nothing."""
    if not exercise:
        return ()
    from tfscratch.specs import engine
    return _scan_groups(engine.shortcut_table().get(exercise, ()))


_ATTR_CALLS = ("builtins.getattr", "builtins.hasattr", "inspect.getattr_static",
               "builtins.setattr", "builtins.delattr")
_EXEC_CALLS = ("builtins.exec", "builtins.eval", "builtins.compile",
               "IPython.shell.run_cell", "IPython.shell.ex", "IPython.shell.ev")
_OPEN_CALLS = ("builtins.open", "io.open", "os.open", "codecs.open")

_CE_LEAVES = {"cross_entropy", "CrossEntropyLoss", "cross_entropy_loss"}
# position of label_smoothing among the positional parameters
_CE_LS_POS = {"cross_entropy": 7, "cross_entropy_loss": 5, "CrossEntropyLoss": 5}

# --------------------------------------------------------------------------- review-only rules
# (prefix of a resolved dotted path, kind, message). The first match wins.
_DANGER: list[tuple[str, str, str]] = [
    ("subprocess", "subprocess", "starts a subprocess"),
    ("os.system", "subprocess", "runs a shell command"),
    ("os.popen", "subprocess", "runs a shell command"),
    ("os.spawn", "subprocess", "starts a process"),
    ("os.exec", "subprocess", "replaces the process"),
    ("os.fork", "subprocess", "forks the process"),
    ("os.posix_spawn", "subprocess", "starts a process"),
    ("os.kill", "subprocess", "sends a signal"),
    ("os.killpg", "subprocess", "sends a signal"),
    ("pty", "subprocess", "opens a pseudo-terminal"),
    ("multiprocessing", "subprocess", "starts processes"),
    ("concurrent.futures.ProcessPoolExecutor", "subprocess", "starts processes"),
    ("signal", "signal", "installs signal handlers"),
    ("socket", "network", "opens a socket"),
    ("ssl", "network", "uses the network"),
    ("urllib", "network", "uses the network"),
    ("http", "network", "uses the network"),
    ("requests", "network", "uses the network"),
    ("httpx", "network", "uses the network"),
    ("aiohttp", "network", "uses the network"),
    ("ftplib", "network", "uses the network"),
    ("smtplib", "network", "uses the network"),
    ("telnetlib", "network", "uses the network"),
    ("websocket", "network", "uses the network"),
    ("sqlite3", "database", "opens an SQLite database (the gradebook is one)"),
    ("sqlalchemy", "database", "opens a database"),
    ("dbm", "database", "opens a database"),
    ("shelve", "database", "opens a database"),
    ("tokenizers", "library", "calls Hugging Face's tokenizers (11 asks for your own BPE)"),
    ("tiktoken", "library", "calls tiktoken (11 asks for your own BPE)"),
    ("sentencepiece", "library", "calls sentencepiece (11 asks for your own BPE)"),
    ("transformers", "library", "calls Hugging Face's transformers"),
    ("ctypes", "native", "calls native code through ctypes"),
    # raw memory of the process (its own objects, the guard's registrations) through numpy
    ("numpy.lib.stride_tricks", "native", "reads or writes raw memory through numpy's stride tricks"),
    ("numpy.ctypeslib", "native", "reads or writes raw memory through numpy.ctypeslib"),
    ("cffi", "native", "calls native code through cffi"),
    ("importlib", "import-machinery", "uses importlib"),
    ("builtins.__import__", "import-machinery", "calls __import__"),
    ("sys.modules", "import-machinery", "reaches sys.modules"),
    ("sys.meta_path", "import-machinery", "changes the import system"),
    ("sys.path_hooks", "import-machinery", "changes the import system"),
    ("sys.settrace", "introspection", "installs a trace function"),
    ("sys.setprofile", "introspection", "installs a profile function"),
    ("sys._getframe", "introspection", "reads the caller's frames"),
    ("sys.excepthook", "ipython-hook", "reaches the exception hook"),
    ("sys.displayhook", "ipython-hook", "reaches the display hook"),
    ("threading.settrace", "introspection", "installs a trace function"),
    ("threading.setprofile", "introspection", "installs a profile function"),
    ("sys.addaudithook", "introspection", "installs an audit hook (it sees the code the grader runs)"),
    ("sys._current_frames", "introspection", "reads every thread's frames"),
    ("gc.callbacks", "introspection", "runs code at every garbage collection"),
    ("signal.signal", "introspection", "installs a signal handler"),
    ("signal.setitimer", "introspection", "sets a timer signal"),
    ("signal.alarm", "introspection", "sets a timer signal"),
    ("inspect.currentframe", "introspection", "reads the caller's frames"),
    ("inspect.stack", "introspection", "reads the caller's frames"),
    ("inspect.getouterframes", "introspection", "reads the caller's frames"),
    ("inspect.getattr_static", "introspection", "looks attributes up dynamically"),
    ("gc.get_objects", "introspection", "searches the interpreter's objects"),
    ("gc.get_referrers", "introspection", "searches the interpreter's objects"),
    ("gc.get_referents", "introspection", "searches the interpreter's objects"),
    ("builtins.exec", "dynamic-code", "runs code from a string (exec)"),
    ("builtins.eval", "dynamic-code", "runs code from a string (eval)"),
    ("builtins.compile", "dynamic-code", "compiles code from a string"),
    ("builtins.globals", "dynamic-code", "reaches globals()"),
    ("marshal", "dynamic-code", "loads code objects"),
    ("types.CodeType", "dynamic-code", "builds code objects"),
    ("types.FunctionType", "dynamic-code", "builds functions from code objects"),
    ("code.interact", "dynamic-code", "starts an interpreter"),
    ("runpy", "dynamic-code", "runs another file"),
    ("unittest.mock", "tamper", "patches objects with unittest.mock"),
    ("mock", "tamper", "patches objects with mock"),
    ("torch.overrides", "torch-function-mode", "reaches torch function modes (the shortcut guard is one)"),
    ("torch.utils._python_dispatch", "torch-function-mode", "reaches torch dispatch modes"),
    ("torch.library", "torch-function-mode", "registers operator implementations"),
    ("torch._C._pop_torch_function_stack", "torch-function-mode", "pops the torch function mode stack (the shortcut guard)"),
    ("torch._C._push_on_torch_function_stack", "torch-function-mode", "changes the torch function mode stack"),
    ("torch._C._set_torch_function_mode", "torch-function-mode", "changes the torch function mode"),
    ("torch._C._len_torch_function_stack", "torch-function-mode", "reads the torch function mode stack"),
    ("torch._C._get_function_stack_at", "torch-function-mode", "reads the torch function mode stack"),
    ("torch._C.DisableTorchFunction", "torch-function-mode", "disables torch function modes (the shortcut guard)"),
    ("torch._C._DisableTorchDispatch", "torch-function-mode", "disables torch dispatch"),
    ("IPython.core", "ipython-hook", "reaches IPython's internals"),
    ("IPython.terminal", "ipython-hook", "reaches IPython's internals"),
    ("ipykernel", "ipython-hook", "reaches the kernel"),
    ("jupyter_client", "ipython-hook", "reaches the kernel"),
    ("nbgrader", "course-files", "reaches nbgrader"),
    ("nbclient", "dynamic-code", "executes notebooks"),
    ("nbconvert", "dynamic-code", "executes or converts notebooks"),
    ("os.chdir", "file-access", "changes the working directory"),
    ("os.listdir", "file-access", "lists directories"),
    ("os.scandir", "file-access", "lists directories"),
    ("os.walk", "file-access", "walks directories"),
    ("os.remove", "file-access", "deletes files"),
    ("os.unlink", "file-access", "deletes files"),
    ("os.rename", "file-access", "moves files"),
    ("os.replace", "file-access", "moves files"),
    ("os.symlink", "file-access", "creates links"),
    ("os.getcwd", "file-access", "reads the working directory"),
    ("os.path.expanduser", "file-access", "reaches the home directory"),
    ("shutil", "file-access", "copies or deletes files"),
    ("glob", "file-access", "lists files"),
    ("pathlib.Path.home", "file-access", "reaches the home directory"),
    ("pathlib.Path.cwd", "file-access", "reads the working directory"),
    ("os.environ", "environment", "reaches the environment (NBGRADER_EXECUTION tells grading apart)"),
    ("os.getenv", "environment", "reads the environment (NBGRADER_EXECUTION tells grading apart)"),
    ("os.putenv", "environment", "changes the environment"),
    ("tfscratch.checks.core._Guard", "torch-function-mode", "reaches the shortcut guard"),
    ("tfscratch.checks.core.no_shortcuts", "torch-function-mode", "reaches the shortcut guard"),
    # code behind names resolved at run time, or library code run again from its source
    ("pydoc.locate", "hidden-code", "resolves a name at run time (pydoc.locate)"),
    ("pkgutil.resolve_name", "hidden-code", "resolves a name at run time (pkgutil.resolve_name)"),
    ("pickle", "hidden-code", "loads objects (and the functions they name) with pickle"),
    ("_pickle", "hidden-code", "loads objects with pickle"),
    ("copyreg", "hidden-code", "changes how objects are loaded"),
    ("typing.get_type_hints", "hidden-code", "evaluates string annotations (code in a string)"),
    ("inspect.getsource", "hidden-code", "reads source code, to run it again"),
    ("operator.attrgetter", "hidden-code", "looks attributes up by a name given at run time"),
    ("operator.methodcaller", "hidden-code", "calls a method by a name given at run time"),
    ("torch._C", "hidden-code", "reaches PyTorch's C internals"),
    ("torch._decomp", "hidden-code", "reaches PyTorch's Python implementations of its operators"),
    ("torch._refs", "hidden-code", "reaches PyTorch's Python implementations of its operators"),
    ("torch._prims", "hidden-code", "reaches PyTorch's primitive operators"),
    ("torch._ops", "hidden-code", "reaches PyTorch's operator registry"),
]

# What the scan cannot read: in an exercise's own cells, a finding of one of these kinds marks
# the submission `review` (grades.csv's status, the report, the formgrader's needs-grading
# list) with its lines; the points the code earned are shown, for a person to decide.
HIDDEN_KINDS = frozenset({"hidden-code", "dynamic-code", "dynamic-lookup", "import-machinery",
                          "torch-function-mode", "introspection", "native",
                          # a program started inside an exercise runs code the scan never sees
                          "subprocess"})
# Kinds that only matter inside an exercise: a process an earlier cell left running ends
# before any check begins (tfsgrade.sandbox_runner), so it cannot touch a result.
EXERCISE_ONLY_KINDS = frozenset({"subprocess", "signal"})
_DANGER_LEAF = {"CheckFailed": ("tamper", "refers to the checks' failure exception"),
                "ShortcutUsed": ("tamper", "refers to the shortcut guard's exception")}

# Modules that standard-library modules import and so expose as attributes (os.sys,
# threading._sys, inspect.builtins...): reached that way they are the module itself, and its
# rules apply (not through other packages: torch.signal is PyTorch's own).
_REEXPORTED = frozenset({"sys", "gc", "os", "builtins", "ctypes", "subprocess", "importlib",
                         "signal", "socket"})

# Attribute assignments under these prefixes are ordinary configuration, not tampering.
_ASSIGN_OK = ("matplotlib", "torch.backends", "numpy.set_printoptions", "pandas.options",
              "warnings.filters")
# Attributes of objects that no honest solution sets.
_HOOK_ATTRS = {"input_transformers_cleanup", "input_transformers_post", "ast_transformers",
               "custom_exceptions", "CustomTB", "showtraceback", "run_cell", "InteractiveTB",
               "__code__", "__globals__", "__defaults__", "__kwdefaults__", "__builtins__",
               "__torch_function__", "__torch_dispatch__"}
# Attributes that reach a running frame (a traceback's, a generator's, a caller's): from there
# the locals of whoever called the student's code, the grader's probe included.
_FRAME_ATTRS = {"tb_frame", "f_back", "f_locals", "f_globals", "gi_frame", "cr_frame", "ag_frame"}
# IPython shell methods an honest notebook uses (magics are checked by name).
_SHELL_OK = {"run_line_magic", "run_cell_magic"}
_MAGICS_OK = {"time", "timeit", "matplotlib", "pdb", "debug", "who", "whos", "who_ls",
              "precision", "prun", "memit", "autoreload", "load_ext", "capture", "xmode",
              "reset_selective", "config", "pylab", "lsmagic", "magic", "history", "pinfo",
              "pinfo2", "psearch", "doctest_mode", "colors", "page"}
_MAGICS_SUBPROCESS = {"system", "sx", "sc", "bash", "sh", "script", "perl", "ruby", "python",
                      "python2", "python3", "pypy", "sx", "killbgscripts"}
_MAGICS_FILES = {"run", "load", "writefile", "loadpy", "cd", "pushd", "popd", "bookmark",
                 "notebook", "save", "edit", "store", "macro", "rerun", "recall"}
_COURSE_PATH = re.compile(
    r"(?:^|[/\\])\.\.(?:[/\\]|$)|(?:^|[/\\])(?:source|solutions|submitted|autograded|feedback|"
    r"release|exchange|notebooks)[/\\]|gradebook|\.ipynb\b|nbgrader|NBGRADER|"
    r"(?:^|[/\\])helpers[/\\]tfscratch|site-packages|\.pth$|ipython[/\\]profile", re.I)
_STAR_INTROSPECT = ("torch", "tfscratch", "scipy", "numpy", "math")
_BUILTINS = {"getattr", "setattr", "delattr", "hasattr", "exec", "eval", "compile", "open",
             "__import__", "globals", "locals", "vars", "breakpoint", "input", "object", "bytes"}
