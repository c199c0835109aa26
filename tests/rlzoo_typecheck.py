"""The runtime type checker the test suite installs on rlzoo (``pytest --jaxtyping-packages``).

beartype with PEP 484's implicit numeric tower, so an ``int`` is accepted where ``float`` is annotated
(``get_loss("grpo", beta=0)``), as Python's typing rules say. Users do not run it; it is a test-time check.
"""

from beartype import BeartypeConf, beartype

__all__ = ["typechecker"]

typechecker = beartype(conf=BeartypeConf(is_pep484_tower=True))
