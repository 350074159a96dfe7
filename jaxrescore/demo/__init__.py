"""The ``jaxrescore demo`` / ``enumerate`` / ``train`` commands' work: each module calls the
library and turns what it returns into plain data and text for :mod:`jaxrescore.cli`. Not API:
the names models are :mod:`jaxrescore.data.names_models`, corpora :mod:`jaxrescore.data.corpus`,
the searches :class:`~jaxrescore.rescore.RescoredIndex` and the best-first baseline.

Modules: ``defaults`` (the commands' defaults, importing nothing), ``args`` (argument checks
worded for the terminal), ``runs`` (one library query each), ``names`` (the names demo),
``enumerate`` (your own models), ``train`` (retraining the names target), ``report`` (text).
"""
