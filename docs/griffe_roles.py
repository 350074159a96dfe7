"""A griffe extension (loaded by mkdocs.yml): the docstrings' Sphinx roles become API links.

The docstrings cross-reference with reStructuredText roles, as Sphinx and ``help()`` readers
expect: ``:class:`~jaxrescore.models.ApplyFnLM```, ``:func:`save_model```, ``:meth:`top_k```,
``:mod:``, ``:attr:``, ``:data:``, ``:exc:``, ``:obj:``, ``:const:`` (and ``:py:class:`` etc.).
mkdocstrings renders Markdown, where a role would print as literal text; this extension rewrites
each role, when the package is loaded for the site, by one rule:

- the target is resolved the way Python would read the name in the docstring's own scope: a full
  path (``jaxrescore.models.ApplyFnLM``) as is; a bare or dotted relative name (``save_model``,
  ``Frontier.moved``, ``top_k`` in a method's docstring) against the object, its class, its
  module (members and imports) and then the package's top level;
- a target found in the package becomes a cross-reference, printed as code: the whole path, or
  only its last component with the ``~`` prefix (``~a.b.C`` shows ``C``), or the title of
  ``:func:`title <target>```. It links to the target's entry when one of the API pages documents
  it, and stays inline code (the full path in its tooltip) when none does (private helpers);
- a dotted target outside the package (``numpy.ndarray``, ``jax.jit``, ``optax.adamw``) or a
  Python builtin (``ValueError``) is inline code, unlinked;
- a full path under the package, or a bare name, that does not resolve (a typo, a renamed or
  moved object) is a warning, which fails ``mkdocs build --strict`` and so the docs test: write
  another library's object with its full dotted path.

``tests/test_docs.py`` builds the site and fails on any role left in the rendered pages, on any
warning, and on any public name (one of the ``__all__`` lists) that printed without its link.
"""

from __future__ import annotations

import html
import re

import griffe

PACKAGE = "jaxrescore"
ROLE = re.compile(
    r":(?:py:)?(?P<kind>class|mod|func|meth|attr|data|exc|obj|const)"
    r":`(?P<body>[^`]+)`"
)
FENCE = re.compile(r"^\s*```")
BUILTINS = {"None", "True", "False", "int", "float", "str", "bool", "tuple", "list", "dict", "ValueError",
            "TypeError", "KeyError", "OSError", "FileNotFoundError", "RuntimeWarning"}

_log = griffe.logger


def _lookup(collection, path: str):
    """The object at ``path`` in the loaded modules (a class's inherited members included), or
    None."""
    parts = path.split(".")
    try:
        obj = collection.get_member(parts[0])
        for part in parts[1:]:
            obj = obj.all_members[part] if obj.is_class or (obj.is_alias and obj.final_target.is_class) \
                else obj.members[part]
    except (KeyError, ValueError, AttributeError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    return obj


def _resolve(obj, name: str, collection) -> str | None:
    """The full path ``name`` means in the scope of ``obj`` (None when it names nothing in the
    loaded package)."""
    name = name.lstrip(".")
    if name.split(".")[0] == PACKAGE:
        return name if _lookup(collection, name) is not None else None
    first, _, rest = name.partition(".")
    scope = obj
    while scope is not None:
        if scope.is_class and first in scope.all_members:  # inherited members too
            base = f"{scope.path}.{first}"
        else:
            try:
                base = scope.resolve(first)
            except griffe.NameResolutionError:
                base = None
        if base is not None:
            path = f"{base}.{rest}" if rest else base
            if _lookup(collection, path) is not None:
                return path
        scope = scope.parent
    top = f"{PACKAGE}.{name}"
    return top if _lookup(collection, top) is not None else None


def _title(target: str, shown: str | None) -> str:
    if shown is not None:
        return shown
    return target.lstrip("~.").rsplit(".", 1)[-1] if target.startswith("~") else target.lstrip(".")


def convert(text: str, obj, collection) -> str:
    """``text`` with every role of the module docstring rule above rewritten."""

    def role(match: re.Match) -> str:
        body = match["body"].strip()
        explicit = re.fullmatch(r"(?P<shown>.+?)\s*<(?P<target>[^<>]+)>", body)
        target, shown = (explicit["target"], explicit["shown"]) if explicit else (body, None)
        title = html.escape(_title(target, shown))
        name = target.lstrip("~")
        path = _resolve(obj, name, collection)
        if path is None:
            bare = name.lstrip(".")
            if bare.split(".")[0] == PACKAGE or ("." not in bare and bare not in BUILTINS):
                _log.warning(
                    "%s: cross-reference %s does not resolve to an object of the package",
                    obj.path, match.group(0),
                )
            return f"<code>{title}</code>"
        return f'<autoref identifier="{path}" optional><code>{title}</code></autoref>'

    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if FENCE.match(line):
            fenced = not fenced
        out.append(line if fenced else ROLE.sub(role, line))
    return "".join(out)


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring of the loaded package (see the module docs)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.name != PACKAGE:
            return
        collection = loader.modules_collection
        stack = [pkg]
        while stack:
            obj = stack.pop()
            if obj.docstring is not None and ":" in obj.docstring.value:
                new = convert(obj.docstring.value, obj, collection)
                if new != obj.docstring.value:
                    obj.docstring.value = new
                    obj.docstring.__dict__.pop("parsed", None)  # parsed again from the new text
            stack.extend(m for m in obj.members.values() if not m.is_alias)
