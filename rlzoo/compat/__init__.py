"""Config translators from other frameworks' configs to rlzoo losses (``rlzoo.compat.trl``)."""

from rlzoo.compat import trl

__all__ = ["trl"]
