"""Token tagging: CoNLL-2003 named entities and any tag set in the CoNLL layout
(`registry.TAGGING`)."""
