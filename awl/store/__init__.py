"""Where a desk keeps its state: the :class:`~awl.store.protocol.Store` protocol and its backends.

``protocol`` says what every backend promises, ``rules`` holds the checks they all share, and
``memory`` and ``sqlite`` are the backends. A store imports documents only.
"""
