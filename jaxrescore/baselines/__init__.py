"""Baselines the speculative search is measured against: exact best-first search over one model
and beam search (fast, no guarantee). They read a model only; no draft index."""

from jaxrescore.baselines.beam import BeamResult, beam_search
from jaxrescore.baselines.best_first import BestFirstResult, best_first_top_k

__all__ = ["BeamResult", "BestFirstResult", "beam_search", "best_first_top_k"]
