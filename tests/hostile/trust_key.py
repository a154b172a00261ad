"""Issue 26, classes 1 and 2: the answer key out of reach. Each student reaches for the
course's own implementation of the exercise being graded, from the objects the course hands
out (`chk`, `R`) or by importing the reference package under another name. In the sandbox
that reference does not exist (tfsgrade.sandbox.course_package), so the cheat earns nothing:
the exercise scores 0, the others keep their points."""
from nbtools import solution_sources, student_notebook

A01, A10 = "01_attention", "10_efficient_attention"

# 1: the check object hands out each exercise's reference object
CHK_SDPA = """def scaled_dot_product_attention(q, k, v):
    ex = next(e for e in chk._cells.values() if e.name == "scaled_dot_product_attention")
    return ex.reference()(q, k, v)
"""

# 2: the reference package by another name, its function found by a prefix
ALIAS_SDPA = """import importlib as _il
_m = _il.import_module("tfscratch.refer" + "ence." + "ma" + "sks")
scaled_dot_product_attention = getattr(_m, [n for n in dir(_m) if n.startswith("scaled")][0])
"""

ALIAS_SOFTMAX = """import importlib as _il
_m = _il.import_module("tfscratch.reference." + "att" + "ention")
def softmax(x, dim=-1):
    return getattr(_m, "soft" + "max")(x, dim)
"""

# 2: notebook 10's setup cell binds R, the reference package
R_FLASH = """_fns = [getattr(R, n) for n in dir(R) if n.endswith("sh_attention")]

def flash_attention(q, k, v, block_size=64, causal=False):
    return _fns[0](q, k, v, block_size=block_size, causal=causal)
"""

EXPECT = {  # (assignment, student): the exercises that must score 0 (every other keeps its points)
    (A01, "key_chk"): ("scaled_dot_product_attention",),
    (A01, "key_alias"): ("softmax", "scaled_dot_product_attention"),
    (A10, "key_r"): ("flash_attention",),
}


def students():
    s01, s10 = solution_sources(A01), solution_sources(A10)
    return [("key_chk", A01, student_notebook(A01, dict(s01, scaled_dot_product_attention=CHK_SDPA))),
            ("key_alias", A01, student_notebook(A01, dict(s01, softmax=ALIAS_SOFTMAX,
                                                          scaled_dot_product_attention=ALIAS_SDPA))),
            ("key_r", A10, student_notebook(A10, dict(s10, flash_attention=R_FLASH)))]
