"""`strata chat`: a terminal chat on the offline engine, multi-turn over the conversation
cache (each turn prefills only what is new), with regenerate, branches and a system prompt."""
