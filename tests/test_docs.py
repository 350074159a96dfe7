"""The documentation site builds in strict mode, documents every public name, and its examples run.

The build is the README's one command (``python3 -m mkdocs build --strict``) into a temporary
folder: a docstring griffe cannot parse, a cross-reference to a name that moved, a link to a
missing page or a missing object fails it, and so does any warning it logs. The docstrings' Sphinx
roles are rendered as links by ``docs/griffe_roles.py``: no role may be left as literal text, and
a role naming a public object must link to its entry. Every ``python`` block of the pages and of
the README runs here.
"""

import contextlib
import html
import importlib
import importlib.util
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings_handlers.python")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    return out, run


@pytest.fixture(scope="module")
def site(build):
    out, run = build
    assert run.returncode == 0, run.stderr[-4000:]
    return out


def test_strict_build_logs_no_warning(build):
    """Strict mode aborts on warnings; any warning line that did not abort it fails here."""
    _, run = build
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert not warnings, "\n".join(warnings)


# A role as the docstrings write it, once rendered: `:class:` then the target (as code or text).
ROLE = re.compile(r":(?:py:)?(?:class|mod|func|meth|attr|data|exc|obj|const):\S")


def page_text(page: Path) -> str:
    """The text a reader sees, each code block and inline code as ``[code]`` (a page may show a
    role inside code, as the contributors' note does; a role left in a docstring renders as
    ``:class:`` followed by its target in code)."""
    text = re.sub(r"<(pre|code)\b.*?</\1>", "[code]", page.read_text(), flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def test_no_sphinx_role_is_left_in_the_rendered_pages(site):
    left = {}
    for page in site.rglob("*.html"):
        found = ROLE.findall(page_text(page))
        if found:
            left[str(page.relative_to(site))] = len(found)
    assert not left, f"Sphinx roles printed as literal text (docs/griffe_roles.py): {left}"


PUBLIC_MODULES = (
    "jaxrescore", "jaxrescore.models", "jaxrescore.rescore", "jaxrescore.index", "jaxrescore.baselines",
    "jaxrescore.data",
)


def public_names() -> dict[str, object]:
    """Every name of the packages' ``__all__`` lists, to the object it names."""
    out = {}
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(module)
        out.update({f"{module}.{n}": getattr(mod, n) for n in mod.__all__})
    return out


def _named(path: str):
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def test_roles_naming_public_objects_link_to_their_entries(site):
    """A converted role whose target is not on any page prints as code with the full path in its
    tooltip (a private helper); a PUBLIC object printed that way means its entry is missing or
    registered under another name."""
    public = public_names()
    objects = {id(obj): path for path, obj in public.items()}
    links = unlinked = 0
    bad = set()
    for page in site.rglob("*.html"):
        text = page.read_text()
        links += len(re.findall(r'class="autorefs autorefs-internal"', text))
        for path in re.findall(r'<span title="(jaxrescore\.[^"]+)"><code>', text):
            unlinked += 1
            obj = _named(path)
            if path in public or (obj is not None and id(obj) in objects and not isinstance(obj, (int, float, str))):
                bad.add(path)
    assert links > 100, "the roles and signatures should link into the API pages"
    assert not bad, f"public objects named in docstrings print without a link: {sorted(bad)}"


def roles_extension():
    spec = importlib.util.spec_from_file_location("griffe_roles", DOCS / "griffe_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_role_rule_resolves_in_the_docstrings_scope(caplog):
    griffe = pytest.importorskip("griffe")
    roles = roles_extension()
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    loader.load("jaxrescore")
    loader.resolve_aliases(implicit=False, external=False)
    collection = loader.modules_collection
    top_k = collection.get_member("jaxrescore.rescore.rescored_index.RescoredIndex.top_k")

    def convert(text, obj=top_k):
        return roles.convert(text, obj, collection)

    ref = '<autoref identifier="{}" optional><code>{}</code></autoref>'
    assert convert(":meth:`sweep`") == ref.format("jaxrescore.rescore.rescored_index.RescoredIndex.sweep", "sweep")
    assert convert(":class:`~jaxrescore.models.ApplyFnLM`") == ref.format("jaxrescore.models.ApplyFnLM", "ApplyFnLM")
    assert convert(":py:func:`jaxrescore.models.from_apply_fn`") == ref.format(
        "jaxrescore.models.from_apply_fn", "jaxrescore.models.from_apply_fn")
    assert convert(":func:`the proof <frontier>`").startswith('<autoref identifier="jaxrescore.rescore.')
    assert convert(":class:`~numpy.ndarray` and :exc:`ValueError`") == "<code>ndarray</code> and <code>ValueError</code>"
    assert convert("```\n:class:`Kept`\n```\n") == "```\n:class:`Kept`\n```\n"  # code blocks stay
    assert not caplog.records
    with caplog.at_level("WARNING"):
        assert convert(":func:`no_such_function`") == "<code>no_such_function</code>"
        assert convert(":class:`jaxrescore.models.NoSuchModel`") == "<code>jaxrescore.models.NoSuchModel</code>"
    where = "jaxrescore.rescore.rescored_index.RescoredIndex.top_k: cross-reference"
    messages = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(messages) == 2 and all(where in m for m in messages), messages
    assert ":func:`no_such_function` does not resolve" in messages[0]
    assert ":class:`jaxrescore.models.NoSuchModel` does not resolve" in messages[1]


def anchors(site: Path) -> set[str]:
    ids = set()
    for page in site.rglob("*.html"):
        ids |= set(re.findall(r'id="(jaxrescore\.[^"]+)"', page.read_text()))
    return ids


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_api_reference_documents_every_public_name(site, module):
    documented = {a.rsplit(".", 1)[-1] for a in anchors(site)}
    missing = sorted(set(importlib.import_module(module).__all__) - documented)
    assert not missing, f"{module}.__all__ names with no entry in docs/api/*.md: {missing}"


def test_pages_render_with_the_figure_and_the_main_entries(site):
    ids = anchors(site)
    for name in (
        "jaxrescore.rescore.RescoredIndex.top_k",
        "jaxrescore.rescore.RescoreResult",
        "jaxrescore.index.SeekIndex.count",
        "jaxrescore.models.from_apply_fn",
        "jaxrescore.models.TransformerLM.score_frontier",
    ):
        assert name in ids
    concepts = (site / "concepts" / "index.html").read_text()
    assert 'src="../figures/concepts.png"' in concepts
    assert (site / "figures" / "concepts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for page in ("porting", "api/rescore", "api/indexes", "api/models", "api/sequences"):
        assert (site / page / "index.html").exists(), page


def test_concepts_figure_script_draws_a_real_query(tmp_path):
    out = tmp_path / "concepts.png"
    subprocess.run(
        [sys.executable, str(DOCS / "make_figures.py"), str(out)], cwd=ROOT, check=True, timeout=300,
        capture_output=True,
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


# ---- every python block of the pages runs ------------------------------------------------------

# A block that continues from objects a reader already has (an API page's "given your flax
# module"), by a marker it contains, and the tiny objects it is run with here. Every other block
# must run as written.
SETUP = {
    "from_linen(module, variables": """
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

V, D = 8, 8

def running_mean(h):  # causal: position j sees tokens 0..j
    return jnp.cumsum(h, axis=-2) / jnp.arange(1, h.shape[-2] + 1, dtype=jnp.float32)[:, None]

class Module(nn.Module):  # tokens int32[B, T] -> logits float[B, T, V]
    @nn.compact
    def __call__(self, tokens, deterministic=True):
        h = nn.Dropout(0.1, deterministic=deterministic)(running_mean(nn.Embed(V + 1, D)(tokens)))
        return nn.Dense(V)(h)

class EqxLM(eqx.Module):  # tokens int32[T] -> logits float[T, V]
    embed: eqx.nn.Embedding
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.embed, self.head = eqx.nn.Embedding(V + 1, D, key=k1), eqx.nn.Linear(D, V, key=k2)

    def __call__(self, tokens):
        return jax.vmap(self.head)(running_mean(jax.vmap(self.embed)(tokens)))

module = Module()
variables = module.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
model = EqxLM(jax.random.PRNGKey(1))
rng = np.random.default_rng(0)
corpus = [tuple(int(t) for t in rng.integers(1, V, size=rng.integers(1, 6))) + (0,) for _ in range(64)]
""",
    # the checkpoint folders a reader keeps: tiny random GPT-2s in the exact Hugging Face layout
    'from_pretrained("./gpt2")': """
from test_models_pretrained import write_gpt2_pair
write_gpt2_pair(".")
""",
}
# Blocks with a test of their own below (which also checks what they compute): the reference
# library's example (it needs the bench extra) and ours beside it.
OWN_TEST = {("docs/porting.md", 0): "test_porting_example_matches_the_reference_library",
            ("docs/porting.md", 1): "test_porting_example_runs_and_proves"}


def python_blocks() -> list[tuple[str, int, str]]:
    """(page, index, code) of every ```python block of the site's pages."""
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        name = page.relative_to(ROOT).as_posix()
        for i, code in enumerate(re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)):
            out.append((name, i, code))
    return out


@pytest.mark.parametrize("page, i, code", [pytest.param(*b, id=f"{b[0]}-{b[1]}") for b in python_blocks()])
def test_every_python_block_of_the_pages_runs(page, i, code, monkeypatch, tmp_path):
    if (page, i) in OWN_TEST:
        pytest.skip(f"run by {OWN_TEST[page, i]}")
    if "equinox" in "".join(s for m, s in SETUP.items() if m in code):
        pytest.importorskip("equinox")
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    setup = "".join(s for marker, s in SETUP.items() if marker in code)
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(setup, "<setup>", "exec"), namespace)
        exec(compile(code, f"{page} python block {i}", "exec"), namespace)
    if "print(result.proven)" in code:
        assert out.getvalue().splitlines()[-1] == "True", out.getvalue()


def porting_blocks() -> list[str]:
    """The reference library's example and ours (the page's first two blocks)."""
    return re.findall(r"```python\n(.*?)```", (DOCS / "porting.md").read_text(), re.S)[:2]


def run_block(code: str) -> dict:
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, str(DOCS / "porting.md"), "exec"), namespace)
    return namespace


def test_porting_example_runs_and_proves():
    reference, ours = porting_blocks()
    assert "from mixle" in reference and "from jaxrescore" in ours
    ns = run_block(ours)
    result = ns["result"]
    assert result.proven is True and result.certified is True and len(result.items) == 5
    assert ns["rescored"].gap == result.gap
    seq, lp = ns["reranked"]
    assert isinstance(seq, tuple) and lp <= 0
    assert ns["target_lp"] == pytest.approx(float(ns["target"].score_sequences([ns["seq"]])[0]))


def test_porting_example_matches_the_reference_library():
    pytest.importorskip("mixle", reason="the reference library comes with the bench extra")
    reference, ours = porting_blocks()
    ref, new = run_block(reference), run_block(ours)
    # the reference's rescored unrank(3) is our index.unrank(3) scored by the target
    assert ref["seq"] == new["seq"]
    assert ref["target_lp"] == pytest.approx(new["target_lp"], abs=1e-5)
    assert [s for s, _ in ref["result"].items] == [s for s, _ in new["result"].items]


def test_porting_string_tokens_example_runs():
    """The guide's string-token example: the reference's function unchanged, results as text."""
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "porting.md").read_text(), re.S)
    namespace: dict = {}
    exec(compile(blocks[2], str(DOCS / "porting.md"), "exec"), namespace)
    result = namespace["result"]
    assert result.proven is True and result.texts == ["", "a", "b"]
