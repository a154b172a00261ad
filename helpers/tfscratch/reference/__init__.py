"""Reference building blocks: the course's own correct implementations.

Later notebooks import what earlier ones built from here, so a learner who is stuck on
notebook 03 can still do notebook 06. Each piece is tested equal to its notebook's solution
and to PyTorch's own module where one exists (tests/test_reference.py).
"""
from .attention import *  # noqa: F401,F403
from .masks import *  # noqa: F401,F403
from .multihead import *  # noqa: F401,F403
from .norm import *  # noqa: F401,F403
from .positional import *  # noqa: F401,F403
from .blocks import *  # noqa: F401,F403

try:  # filled by notebooks 07 and 08
    from .transformer import *  # noqa: F401,F403
except ImportError:  # pragma: no cover
    pass
try:
    from .decoder_only import *  # noqa: F401,F403
except ImportError:  # pragma: no cover
    pass
