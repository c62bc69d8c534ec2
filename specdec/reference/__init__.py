"""Readable reference implementations: the correctness oracle for the fast code.

One algorithm per file, written to be read top to bottom with the papers' names. Nothing
here imports from the rest of the package except :mod:`specdec.types`, so an oracle never
shares code with what it judges.
"""
