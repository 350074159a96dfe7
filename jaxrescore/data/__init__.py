"""Small real corpora shipped with the package, and their loaders."""

from jaxrescore.data.names import (
    ALPHABET,
    EOS,
    MAX_NAME_LEN,
    VOCAB_SIZE,
    decode,
    encode,
    load_names,
    name_ranks,
)

__all__ = [
    "ALPHABET",
    "EOS",
    "MAX_NAME_LEN",
    "VOCAB_SIZE",
    "decode",
    "encode",
    "load_names",
    "name_ranks",
]
