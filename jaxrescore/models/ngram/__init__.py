"""The n-gram model: its tables (state), fitting, lookups, and the NGramLM shell."""

from jaxrescore.models.ngram.model import NGramLM
from jaxrescore.models.ngram.tables import NGramLevel, NGramTables

__all__ = ["NGramLM", "NGramLevel", "NGramTables"]
