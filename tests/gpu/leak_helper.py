"""A helper module that keeps a scaled copy of what it is given: the leak is in this file, not the loop's."""
_seen = []


def remember(t):
    _seen.append(t * 2)
