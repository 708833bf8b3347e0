#!/usr/bin/env python
"""Search quality eval (design §8): kb vs BM25 vs the vector leg alone, per language.

Pairs (query → the one relevant document) are built from the shared corpus itself; no query is
written by hand.

- English, tldr pages: the query is a page's description (its first ``>`` line that is not "More
  information", "See also" or an alias note) with the command's name removed, e.g. ``gh org`` →
  "Work with GitHub organizations" minus "gh". A description is what a user who does not remember
  the command would type; removing the name stops a query from naming its answer. The relevant
  document is the page, indexed without its ``>`` description block (held out): with it, every
  system finds the page by exact match (BM25 recall@5 was 0.99 on 1,000 pages), which measures
  nothing; without it, the page must be found from its title, examples and their explanations.
  The retrieval corpus is a seeded sample of ``--tldr-pages`` pages (queries from them).
- German, Russian, Arabic, Japanese, Traditional Chinese, the obsidian-help vaults: the query is
  the sentence around a wikilink ``[[Target|text]]`` with every wikilink removed from it, and the
  relevant document is the link's target (a page of the same vault, not the page itself; links to
  headings of the same page, embeds ``![[…]]`` and attachments are skipped). The sentence a writer
  puts around a link says what the linked page is for ("Mit X kannst du Notizen zwischen Geräten
  synchronisieren"), in the vault's own language, written by the help's translators; removing the
  link text stops it from giving away the target's title. The source page contains the sentence
  verbatim, so it is excluded from every system's ranking (a reader does not search for the page
  they are reading).
- English, the obsidian-help vault (``en-vault``): the same link sentences from the English vault,
  so that all six vault languages are measured alike. Until the fusion rows per language were
  chosen these pairs were kept out of every run, as an independent check.

Systems, all over the same documents in the same run:

- kb: ``KnowledgeBase.search`` (the facade, k = 10) with the settings in kb/search/hybrid.py.
- vector: kb's vector leg alone (chunks ranked by cosine distance, grouped by document).
- text, document: kb's chunk leg alone (grouped by document) and its document leg alone (BM25
  over whole documents).
- bm25: the ``bm25s`` package (Lucene BM25, k1 = 1.5, b = 0.75) over whole documents, tokenized
  by ``bm25s.tokenize`` with PyStemmer's stemmer and bm25s' stop words where it has them for the
  language, and with kb's CJK segmentation applied first (so BM25 is not handicapped on
  Japanese and Chinese, which have no spaces): its bigrams, since bm25s' token pattern drops the
  single characters kb also indexes (Lucene's CJK analyzer by default, bigrams alone).
- alternatives not adopted (``--alternatives``), measured so the decision can be checked:
  ``kb+grams``, kb's three legs plus a fourth, BM25 over each word's character 4-grams (bm25s,
  whole documents; a common remedy for compounds and rich morphology), all full-text legs at
  0.25; ``bm25+rm3``, bm25s with RM3 pseudo-relevance feedback (the 3 best documents' 10 best
  terms, weight 0.3, re-ranked), which kb could run as a second statement; ``kb+phrases``, kb's
  legs plus BM25 over adjacent word pairs (stemmed, stop words out: the phrases a query shares
  with a page) at 0.1, k 10; ``kb+docvec``, kb's legs plus a document vector leg (the normalized
  mean of a document's chunk vectors; weighted like the vector leg, × 0.5), k 10; ``kb+vprf``,
  the vector leg run again with Rocchio feedback (query + 0.3 × the mean of the best chunk
  vectors of kb's first three documents), full-text legs at 0.25. Weights of each are the best of
  a grid on the tune split (by the mean margin over the six languages).
- the fusion grid: the three legs' document rankings fused with other weights and k (``--grid``),
  to choose kb's settings; what kb ships is reported as "kb". ``--dump DIR`` writes every pair's
  leg rankings, to study other fusions offline.

Metrics: recall@5 (the relevant document among the first 5) and MRR@10.

Splits: every pair belongs to one half, "tune" or "held-out", by the first byte of the SHA-256
of its query and target (fixed by the pair alone, before any system ranks it). kb's settings
(BM25 k1, b, title weight, fusion weights and k) are chosen on ``--split tune`` and figures are
reported on ``--split held-out`` (the default), never the other way round.

Usage: python bin/eval_search.py [--languages en de ru ar ja zh-TW] [--split held-out] [--pairs 0]
       [--tldr-pages 1000] [--vault-documents 60] [--model minilm] [--grid]
The first run indexes every corpus with the model (minutes per language with MiniLM on 2 cores);
the database under --work (default /tmp/kb-eval) keeps the index and the embedding cache, so later
runs reindex (seconds: rows another kb version derived differently are written again, with cached
vectors) and search. Writes bench-results/eval-<time>.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kb.db import database  # noqa: E402
from kb.index.embedding import make_embedder  # noqa: E402
from kb.index.languages import detect_language, lexical_text  # noqa: E402
from kb.index.models import auto_choice  # noqa: E402
from kb.knowledge_base import KnowledgeBase  # noqa: E402
from kb.search.hybrid import (  # noqa: E402
    DOCUMENT_WEIGHT,
    LEG_LIMIT,
    RRF_K,
    TEXT_WEIGHT,
    UNCOVERED_VECTOR_WEIGHT,
    VECTOR_WEIGHT,
    fuse,
    lexical_leg,
    vector_leg,
    vector_weight,
)
from kb.settings import Settings  # noqa: E402
from tests.support.named_queries import queries  # noqa: E402

CORPUS = ROOT.parent / "shared" / "corpus"
VAULTS = {"en-vault": "en", "de": "de", "ru": "ru", "ar": "ar", "ja": "ja", "zh-TW": "zh-TW"}
STEMMERS = {"en": "english", "en-vault": "english", "de": "german", "ru": "russian", "ar": "arabic"}
STOPWORDS = {"en": "en", "en-vault": "en", "de": "de", "ru": "ru", "zh-TW": "zh"}
SEED = 12
WORKSPACES = {"en": 11, "en-vault": 12, "de": 2, "ru": 3, "ar": 4, "ja": 5, "zh-TW": 6}
"""Workspace of each language's corpus in the eval database (11: tldr with descriptions held out;
12: the English vault)."""

_LINK = re.compile(r"(!?)\[\[([^\]|#]*)(#[^\]|]*)?(?:\|([^\]]*))?\]\]")
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s*")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def tldr_query(text: str) -> str | None:
    """The page's description with the command name removed (None when it has no usable one)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        return None
    name = lines[0][2:].strip()
    for line in lines[1:]:
        if not line.startswith("> "):
            continue
        description = line[2:].strip()
        if description.startswith(("More information", "See also", "This command is", "Note:")):
            continue
        for variant in {name, name.replace("-", " "), *[p for p in re.split(r"[-._ ]", name) if len(p) > 2]}:
            description = re.sub(rf"(?i)(?<![\w-]){re.escape(variant)}(?![\w-])", " ", description)
        description = re.sub(r"`\s*`", " ", description)
        description = re.sub(r"\s+", " ", description).strip(" .,:;")
        return description if len(description.split()) >= 3 else None
    return None


def link_pairs(vault: Path) -> list[tuple[str, str, str]]:
    """``(query, source path, target path)`` from the vault's wikilink sentences (see the docstring)."""
    files = sorted(vault.rglob("*.md"))
    by_stem: dict[str, Path] = {}
    for path in files:
        by_stem.setdefault(path.stem.casefold(), path)
    pairs, seen = [], set()
    for path in files:
        fenced = False
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
            if fenced or line.lstrip().startswith("#"):
                continue
            for sentence in _SENTENCE_END.split(line):
                for match in _LINK.finditer(sentence):
                    embed, target = match.group(1), match.group(2).strip()
                    if embed or not target:
                        continue
                    target_path = by_stem.get(Path(target).name.casefold())
                    if target_path is None or target_path == path:
                        continue
                    query = _LINK.sub(" ", sentence)
                    query = re.sub(r"[*_`>|]+|^\s*(?:[-+]|\d+\.)\s+|\[!\w+\][-+]?", " ", query)
                    query = re.sub(r"\s+", " ", query).strip(" .,:;-–—()（）、。")
                    long_enough = (len(_CJK.findall(query)) >= 12) if _CJK.search(query) else len(query.split()) >= 5
                    key = (query, target_path)
                    if long_enough and key not in seen:
                        seen.add(key)
                        pairs.append((query, str(path.relative_to(vault)), str(target_path.relative_to(vault))))
    return pairs


class RememberedQueries:
    """The active embedder, answering the eval's queries from vectors computed once in a batch (so
    the facade's own query embedding does not embed each query a second time)."""

    def __init__(self, embedder, vectors: dict[str, np.ndarray]) -> None:
        self.embedder, self.vectors = embedder, vectors
        self.model, self.dim, self.semantic = embedder.model, embedder.dim, embedder.semantic
        self.languages = getattr(embedder, "languages", None)

    def embed(self, texts: list[str]):
        if all(t in self.vectors for t in texts):
            import numpy as np

            return np.stack([self.vectors[t] for t in texts])
        return self.embedder.embed(texts)


def split_of(query: str, target: str) -> str:
    """``"tune"`` or ``"held-out"``: the half a pair belongs to, from the first byte of
    sha256(query, target) (even: tune). Fixed by the pair alone, before any system ranks it."""
    return "tune" if hashlib.sha256(f"{query}\n{target}".encode()).digest()[0] % 2 == 0 else "held-out"


def metrics(ranked: list[str], relevant: str) -> tuple[float, float]:
    """(recall@5, reciprocal rank within 10) of one ranking."""
    top = ranked[:10]
    rank = top.index(relevant) + 1 if relevant in top else None
    return (1.0 if rank and rank <= 5 else 0.0), (1.0 / rank if rank else 0.0)


def documents_of(chunk_ids: list[int], chunk_document: dict[int, str], exclude: str) -> list[str]:
    """Document paths in order of their best chunk, ``exclude`` left out."""
    out: dict[str, None] = {}
    for chunk_id in chunk_ids:
        path = chunk_document.get(chunk_id)
        if path is not None and path != exclude:
            out.setdefault(path, None)
    return list(out)


def bm25_index(documents: dict[str, str], language: str):
    """``(paths, corpus tokens, bm25s retriever, query tokenizer)`` over ``documents`` for ``language``."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer(STEMMERS[language]) if language in STEMMERS else None
    stopwords = STOPWORDS.get(language, [])
    paths = list(documents)
    corpus_tokens = bm25s.tokenize(
        [lexical_text(documents[p]) for p in paths], stopwords=stopwords, stemmer=stemmer, show_progress=False
    )
    retriever = bm25s.BM25()
    retriever.index(corpus_tokens, show_progress=False)

    def tokenize(query: str, return_ids: bool = True):
        return bm25s.tokenize(
            [lexical_text(query)], stopwords=stopwords, stemmer=stemmer, show_progress=False, return_ids=return_ids
        )

    return paths, corpus_tokens, retriever, tokenize


def bm25_rankings(documents: dict[str, str], language: str, pairs, exclude_sources: bool) -> list[list[str]]:
    paths, _corpus_tokens, retriever, tokenize = bm25_index(documents, language)
    rankings = []
    for query, source, _target in pairs:
        tokens = tokenize(query)
        if not any(len(t) for t in tokens.ids):
            rankings.append([])
            continue
        results, _scores = retriever.retrieve(tokens, k=min(11, len(paths)), show_progress=False)
        ranked = [paths[i] for i in results[0].tolist()]
        rankings.append([p for p in ranked if not (exclude_sources and p == source)])
    return rankings


_WORD = re.compile(r"\w+")


def word_grams(text: str, n: int = 4) -> list[str]:
    """Character ``n``-grams of each lower-cased word of ``lexical_text(text)``, the word padded
    with ``_`` at both ends (a word shorter than ``n`` - 2 is one gram)."""
    out = []
    for word in _WORD.findall(lexical_text(text).lower()):
        padded = f"_{word}_"
        out.extend(padded[i : i + n] for i in range(max(1, len(padded) - n + 1)))
    return out


def unit_rankings(documents: dict[str, str], units_of, pairs, exclude_sources: bool, limit: int) -> list[list[str]]:
    """bm25s (k1 1.5, b 0.75) over the units ``units_of(text)`` gives each document and query
    (character grams, word pairs), the first ``limit`` documents with a positive score."""
    import bm25s

    paths = list(documents)
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(u, len(vocab)) for u in units_of(documents[p])] for p in paths]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)
    rankings = []
    for query, source, _target in pairs:
        query_ids = [vocab[u] for u in units_of(query) if u in vocab]
        scores = retriever.get_scores(query_ids) if query_ids else [0.0] * len(paths)
        order = sorted(range(len(paths)), key=lambda i: -scores[i])
        rankings.append(
            [paths[i] for i in order if scores[i] > 0 and not (exclude_sources and paths[i] == source)][:limit]
        )
    return rankings


def gram_rankings(documents: dict[str, str], pairs, exclude_sources: bool) -> list[list[str]]:
    """bm25s over the documents' word 4-grams (``word_grams``), the first 11."""
    return unit_rankings(documents, word_grams, pairs, exclude_sources, 11)


def phrase_rankings(documents: dict[str, str], language: str, pairs, exclude_sources: bool) -> list[list[str]]:
    """bm25s over adjacent pairs of the words ``bm25_index`` keeps (stemmed, stop words out)."""
    _paths, _corpus_tokens, _retriever, tokenize = bm25_index(documents, language)

    def pairs_of(text: str) -> list[str]:
        words = tokenize(text, return_ids=False)[0]
        return [f"{a} {b}" for a, b in zip(words, words[1:])]

    return unit_rankings(documents, pairs_of, pairs, exclude_sources, LEG_LIMIT)


class ChunkVectors:
    """The workspace's chunk vectors in numpy (``eval_chunk_vectors``), for ``kb+docvec`` and
    ``kb+vprf``: ``ids``, ``paths`` (per chunk) and the matrix ``vectors``, rows normalized."""

    def __init__(self, conn, workspace_id: int, model: str) -> None:
        import numpy as np

        rows = conn.execute(queries["eval_chunk_vectors"], {"workspace_id": workspace_id, "model": model}).fetchall()
        self.ids = [r["id"] for r in rows]
        self.paths = [r["path"].removeprefix("/documents/") for r in rows]
        self.vectors = np.array([json.loads(r["embedding"]) for r in rows], dtype=np.float32)
        self.vectors /= np.maximum(np.linalg.norm(self.vectors, axis=1, keepdims=True), 1e-12)
        by_document: dict[str, list[int]] = {}
        for row, path in enumerate(self.paths):
            by_document.setdefault(path, []).append(row)
        self.documents = list(by_document)
        means = np.stack([self.vectors[rows].mean(axis=0) for rows in by_document.values()])
        self.document_vectors = means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)

    def document_ranking(self, vector, exclude: str | None) -> list[str]:
        """Documents by cosine of their mean chunk vector to ``vector``."""
        import numpy as np

        order = np.argsort(-(self.document_vectors @ vector))
        return [self.documents[i] for i in order if self.documents[i] != exclude][:LEG_LIMIT]

    def feedback_ranking(self, vector, feedback: list[str], beta: float, exclude: str | None) -> list[str]:
        """Documents by their best chunk for ``vector`` + ``beta`` × the mean of the best chunk
        vector (for ``vector``) of each document in ``feedback`` (Rocchio)."""
        import numpy as np

        scores = self.vectors @ vector
        best = {}
        for row in np.argsort(-scores):
            if self.paths[row] in feedback and self.paths[row] not in best:
                best[self.paths[row]] = row
            if len(best) == len(feedback):
                break
        if best:
            vector = vector + beta * self.vectors[list(best.values())].mean(axis=0)
            vector = vector / np.linalg.norm(vector)
        order = np.argsort(-(self.vectors @ vector))[: 4 * LEG_LIMIT]
        return documents_of([self.ids[i] for i in order], dict(zip(self.ids, self.paths)), exclude)[:LEG_LIMIT]


def rm3_rankings(
    documents: dict[str, str],
    language: str,
    pairs,
    exclude_sources: bool,
    feedback_documents: int = 3,
    feedback_terms: int = 10,
    weight: float = 0.3,
) -> list[list[str]]:
    """bm25s as ``bm25_rankings`` with RM3 feedback: the query's terms (1 - ``weight``, spread
    evenly) plus the ``feedback_terms`` terms weighing most in the first ``feedback_documents``
    documents (term frequency / length × log(1 + N / df), each document weighted by the softmax of
    its score; ``weight``), scored again as a weighted sum of per-term BM25."""
    from collections import Counter

    import numpy as np

    paths, tokens, retriever, tokenize = bm25_index(documents, language)
    counts = [Counter(ids) for ids in tokens.ids]
    df = Counter(term for c in counts for term in c)
    rankings = []
    for query, source, _target in pairs:
        words = tokenize(query, return_ids=False)[0]
        query_ids = [tokens.vocab[w] for w in words if w in tokens.vocab]
        if not query_ids:
            rankings.append([])
            continue
        excluded = [i for i, p in enumerate(paths) if exclude_sources and p == source]
        scores = retriever.get_scores(query_ids)
        scores[excluded] = -np.inf
        top = np.argsort(-scores)[:feedback_documents]
        share = np.exp(scores[top] - scores[top].max())
        share /= share.sum()
        expansion: Counter = Counter()
        for s, d in zip(share, top):
            length = sum(counts[d].values())
            for term, c in counts[d].items():
                expansion[term] += s * c / length * np.log(1 + len(paths) / df[term])
        chosen = expansion.most_common(feedback_terms)
        total = sum(v for _, v in chosen) or 1.0
        final: Counter = Counter({t: (1 - weight) / len(query_ids) for t in query_ids})
        for term, v in chosen:
            final[term] += weight * v / total
        rescored = sum(v * retriever.get_scores([t]) for t, v in final.items())
        rescored[excluded] = -np.inf
        rankings.append([paths[i] for i in np.argsort(-rescored)[:11] if rescored[i] > 0])
    return rankings


def prepare(kb: KnowledgeBase, ws: int, language: str, args, choose=None) -> tuple[list, dict[str, str], bool]:
    """Import the language's corpus into ``ws`` (once) and reindex it; returns (pairs, documents, exclude_sources).
    ``choose(documents)`` is called before indexing (``--model auto``: the model for the corpus)."""
    work = args.work / "corpora" / language
    rng = random.Random(SEED)
    if language == "en":
        pages = sorted((CORPUS / "tldr" / "pages").rglob("*.md"))
        pages = [p for p in pages if not p.name.startswith(".")]
        chosen = sorted(rng.sample(pages, min(args.tldr_pages, len(pages))))
        originals = {str(p.relative_to(CORPUS / "tldr" / "pages")): p.read_text(encoding="utf-8") for p in chosen}
        pairs = [(q, None, path) for path, text in originals.items() if (q := tldr_query(text))]
        documents = {
            path: "\n".join(line for line in text.split("\n") if not line.startswith("> "))
            for path, text in originals.items()
        }
        exclude_sources = False
    else:
        vault = CORPUS / "obsidian-help" / VAULTS[language]
        pairs = link_pairs(vault)
        # the corpus: the --vault-documents pages most linked to (all pages with 0), and the
        # pairs whose target is among them; a source page need not be in the corpus
        incoming: dict[str, int] = {}
        for _query, _source, target in pairs:
            incoming[target] = incoming.get(target, 0) + 1
        paths = sorted(vault.rglob("*.md"))
        if args.vault_documents:
            keep = set(sorted(incoming, key=lambda t: (-incoming[t], t))[: args.vault_documents])
            paths = [p for p in paths if str(p.relative_to(vault)) in keep]
        documents = {str(p.relative_to(vault)): p.read_text(encoding="utf-8") for p in paths}
        pairs = [pair for pair in pairs if pair[2] in documents]
        exclude_sources = True
    pairs = [pair for pair in pairs if args.split == "all" or split_of(pair[0], pair[2]) == args.split]
    pairs = sorted(rng.sample(pairs, min(args.pairs or len(pairs), len(pairs))))
    if not kb.store(ws).exists():
        shutil.rmtree(work, ignore_errors=True)
        for rel, text in documents.items():
            target = work / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        kb.import_folder(work, ws)
    if choose is not None:
        choose(documents)
    t0 = time.perf_counter()
    # a reindex, not an index run: it also re-derives chunk rows an earlier kb wrote (another CJK
    # segmentation, unnormalized text), so a --work database kept across kb versions measures
    # what this kb indexes (unchanged rows and cached vectors are reused: seconds per corpus)
    report = kb.reindex(ws)
    print(
        f"{language}: {len(documents)} documents, {len(pairs)} pairs; index {time.perf_counter() - t0:.0f}s "
        f"({report.embeddings_computed} embedded, {report.embeddings_cached} cached, "
        f"{len(report.failures)} failed)",
        flush=True,
    )
    return pairs, documents, exclude_sources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--languages", nargs="+", default=["en", "en-vault", "de", "ru", "ar", "ja", "zh-TW"])
    parser.add_argument(
        "--pairs", type=int, default=0, help="pairs per language (a seeded sample of the split; 0: all of it)"
    )
    parser.add_argument(
        "--split",
        choices=("held-out", "tune", "all"),
        default="held-out",
        help="which half of the pairs to score (choose settings on tune, report held-out)",
    )
    parser.add_argument("--tldr-pages", type=int, default=1000)
    parser.add_argument(
        "--vault-documents",
        type=int,
        default=60,
        help="per vault, the N pages most linked to form the corpus (0: all 173)",
    )
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--grid", action="store_true", help="also score other fusion weights and k")
    parser.add_argument(
        "--alternatives",
        action="store_true",
        help="also score kb+grams, bm25+rm3, kb+phrases, kb+docvec and kb+vprf "
        "(measured, not adopted; see the docstring)",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/kb-eval"))
    parser.add_argument(
        "--dump",
        type=Path,
        default=None,
        help="also write each pair's leg rankings (JSON) here, to study fusion offline",
    )
    args = parser.parse_args()
    if not CORPUS.exists():
        sys.exit(f"corpus {CORPUS} is absent")
    try:
        import torch

        torch.set_num_threads(args.threads)
    except ImportError:
        pass
    settings = Settings(storage_root=args.work / "storage", embedding_model=args.model)
    if settings.database_url is None:
        settings = settings.model_copy(
            update={"database_url": database.start_embedded(args.work / "pg", database="kb_eval")}
        )
    kb = KnowledgeBase.open(settings)
    embedders: dict[str, object] = {}

    def model_named(name: str):
        if name not in embedders:
            embedders[name] = make_embedder(settings.model_copy(update={"embedding_model": name}))
        return embedders[name]

    # --model auto: each language's workspace gets the model kb's auto picks for its documents
    # (kb.index.models.auto_choice over their detected languages); the first one stands in here
    embedder = kb.use_embedder(model_named("minilm" if args.model == "auto" else args.model))
    result: dict = {
        "model": embedder.model,
        "split": args.split,
        "load_average": os.getloadavg(),
        "settings": {
            "rrf_k": RRF_K,
            "vector_weight": VECTOR_WEIGHT,
            "text_weight": TEXT_WEIGHT,
            "document_weight": DOCUMENT_WEIGHT,
            "uncovered_vector_weight": UNCOVERED_VECTOR_WEIGHT,
        },
        "languages": {},
    }
    # fusion per document, as kb.search.rank_documents does; wv is the covered-language weight (a
    # query the model does not cover gets wv × UNCOVERED_VECTOR_WEIGHT / VECTOR_WEIGHT, as in kb)
    grid = [
        (wv, wt, wd, rk)
        for wv in (0.5, 1.0)
        for wt in (0.1, 0.25, 0.5, 0.75)
        for wd in (0.25, 0.5, 0.75, 1.0)
        for rk in (2, 5, 10, 20)
    ]
    for language, ws in WORKSPACES.items():
        if language not in args.languages:
            continue

        def choose(documents: dict[str, str], language: str = language) -> None:
            nonlocal embedder
            if args.model == "auto":
                name = auto_choice(Counter(detect_language(text) for text in documents.values()))
                embedder = kb.use_embedder(model_named(name))
                print(f"{language}: auto picks {name} ({embedder.model})", flush=True)

        pairs, documents, exclude_sources = prepare(kb, ws, language, args, choose)
        with database.connect(kb.database_url, autocommit=True) as conn:
            chunk_document = {
                r["id"]: r["path"].removeprefix("/documents/")
                for r in conn.execute(queries["eval_chunk_documents"], {"workspace_id": ws})
            }
            document_path = {
                r["id"]: r["path"].removeprefix("/documents/")
                for r in conn.execute(queries["eval_document_paths"], {"workspace_id": ws})
            }
        if hasattr(embedder, "embed_query"):  # e5: a query is embedded with its own prefix
            import numpy

            vectors = numpy.stack([embedder.embed_query(q) for q, _, _ in pairs])
        else:
            vectors = embedder.embed([q for q, _, _ in pairs])
        kb.use_embedder(RememberedQueries(embedder, dict(zip((q for q, _, _ in pairs), vectors))))
        scores: dict[str, list[tuple[float, float]]] = {"kb": [], "vector": [], "text": [], "document": [], "bm25": []}
        if args.alternatives:
            scores |= {"kb+grams": [], "bm25+rm3": [], "kb+phrases": [], "kb+docvec": [], "kb+vprf": []}
            grams = gram_rankings(documents, pairs, exclude_sources)
            phrases = phrase_rankings(documents, language, pairs, exclude_sources)
            with database.connect(kb.database_url, autocommit=True) as conn:
                chunk_vectors = ChunkVectors(conn, ws, embedder.model)
            for ranked, (_query, _source, target) in zip(
                rm3_rankings(documents, language, pairs, exclude_sources), pairs
            ):
                scores["bm25+rm3"].append(metrics(ranked, target))
        grid_scores: dict[tuple, list] = {g: [] for g in grid}
        legs = []
        with database.connect(kb.database_url, autocommit=True) as conn:
            for (query, source, target), vector in zip(pairs, vectors):
                v_ids = vector_leg(conn, ws, embedder.model, vector, LEG_LIMIT)
                t_ids = lexical_leg(conn, ws, query, LEG_LIMIT)
                d_paths = [document_path[i] for i in lexical_leg(conn, ws, query, LEG_LIMIT, unit="document")]
                legs.append((v_ids, t_ids, d_paths))
                exclude = source if exclude_sources else None
                v_paths = documents_of(v_ids, chunk_document, exclude)
                t_paths = documents_of(t_ids, chunk_document, exclude)
                d_paths = [p for p in d_paths if p != exclude]
                scores["vector"].append(metrics(v_paths, target))
                scores["text"].append(metrics(t_paths, target))
                scores["document"].append(metrics(d_paths, target))
                found = [e.path.removeprefix("/documents/") for e in kb.search(ws, query, k=11)]
                scores["kb"].append(metrics([p for p in found if p != exclude], target))
                if args.alternatives:
                    wv = vector_weight(embedder, query)
                    fused = fuse([(wv, v_paths), (0.25, t_paths), (0.25, d_paths), (0.25, grams[len(legs) - 1])])
                    scores["kb+grams"].append(metrics([p for p, _ in fused], target))
                    fused = fuse(
                        [
                            (wv, v_paths),
                            (TEXT_WEIGHT, t_paths),
                            (DOCUMENT_WEIGHT / 2, d_paths),
                            (0.1, phrases[len(legs) - 1]),
                        ],
                        10,
                    )
                    scores["kb+phrases"].append(metrics([p for p, _ in fused], target))
                    fused = fuse(
                        [
                            (wv, v_paths),
                            (TEXT_WEIGHT, t_paths),
                            (DOCUMENT_WEIGHT, d_paths),
                            (wv / 2, chunk_vectors.document_ranking(vector, exclude)),
                        ],
                        10,
                    )
                    scores["kb+docvec"].append(metrics([p for p, _ in fused], target))
                    kb_first = [
                        p for p, _ in fuse([(wv, v_paths), (TEXT_WEIGHT, t_paths), (DOCUMENT_WEIGHT, d_paths)])
                    ][:3]
                    fused = fuse(
                        [
                            (wv, chunk_vectors.feedback_ranking(vector, kb_first, 0.3, exclude)),
                            (0.25, t_paths),
                            (0.25, d_paths),
                        ]
                    )
                    scores["kb+vprf"].append(metrics([p for p, _ in fused], target))
                if args.grid:
                    covered = vector_weight(embedder, query) == VECTOR_WEIGHT
                    for wv, wt, wd, rk in grid:
                        fused = fuse(
                            [
                                (wv if covered else wv * UNCOVERED_VECTOR_WEIGHT / VECTOR_WEIGHT, v_paths),
                                (wt, t_paths),
                                (wd, d_paths),
                            ],
                            rk,
                        )
                        grid_scores[(wv, wt, wd, rk)].append(metrics([p for p, _ in fused], target))
        kb.use_embedder(embedder)
        bm25 = bm25_rankings(documents, language, pairs, exclude_sources)
        for ranked, (_query, _source, target) in zip(bm25, pairs):
            scores["bm25"].append(metrics(ranked, target))
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{language}-{args.split}.json").write_text(
                json.dumps(
                    {
                        "chunk_document": chunk_document,
                        "exclude_sources": exclude_sources,
                        "pairs": [
                            {"query": q, "source": s, "target": t, "vector": v, "text": x, "document": d, "bm25": b}
                            for (q, s, t), (v, x, d), b in zip(pairs, legs, bm25)
                        ],
                    }
                )
            )
        summary = {
            name: {
                "recall@5": round(statistics.mean(r for r, _ in s), 4),
                "mrr@10": round(statistics.mean(m for _, m in s), 4),
            }
            for name, s in scores.items()
        }
        summary["pairs"] = len(pairs)
        summary["model"] = embedder.model
        best_other = max(summary["bm25"]["recall@5"], summary["vector"]["recall@5"])
        summary["kb_margin_recall@5"] = round(summary["kb"]["recall@5"] - best_other, 4)
        if args.grid:
            summary["grid"] = {
                f"wv={wv} wt={wt} wd={wd} k={rk}": round(statistics.mean(r for r, _ in s), 4)
                for (wv, wt, wd, rk), s in grid_scores.items()
            }
        result["languages"][language] = summary
        print(
            f"{language} ({len(pairs)} pairs): "
            + " | ".join(
                f"{name} R@5 {summary[name]['recall@5']:.3f} MRR@10 {summary[name]['mrr@10']:.3f}" for name in scores
            )
            + f" | kb − best other R@5 {summary['kb_margin_recall@5']:+.3f}",
            flush=True,
        )
        if args.grid:
            best = sorted(summary["grid"].items(), key=lambda item: -item[1])[:5]
            print(f"  grid best R@5: {best}", flush=True)
    database.close_pools()
    out = ROOT / "bench-results"
    out.mkdir(exist_ok=True)
    path = out / f"eval-{'-'.join(args.languages)}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
