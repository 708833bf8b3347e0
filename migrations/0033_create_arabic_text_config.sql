-- design §8: the text-search configuration of Arabic documents and queries. Postgres' `arabic`
-- passes words written in Latin letters (asciiword, asciihword, hword_asciipart) to the Arabic
-- stemmer, which leaves them as written, while its configurations of the other languages written
-- in another script do what an Arabic technical text needs: `russian` stems them with the English
-- stemmer. Arabic pages about software name its parts in English ("plugins", "values", "Notes"),
-- so with `arabic` a query's "plugin" missed a page's "plugins". kb.arabic is `arabic` with
-- Latin-letter words through `english_stem` (and its English stop words), as `russian` has them;
-- kb.index.languages maps Arabic to it, and `kb reindex` writes the chunks of Arabic pages again
-- (their vectors from the embedding cache; a chunk row whose configuration is not the document's
-- is never kept).
CREATE TEXT SEARCH CONFIGURATION kb.arabic (COPY = pg_catalog.arabic);

ALTER TEXT SEARCH CONFIGURATION kb.arabic ALTER MAPPING FOR asciiword, asciihword, hword_asciipart WITH english_stem;
