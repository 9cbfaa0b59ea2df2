"""Developer checks that read the code and run none of it (`layers`: which way imports may point)."""
