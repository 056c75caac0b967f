"""The OpenAI-compatible server: the protocol and its validation (``protocol.py``: the request models; ``body.py``: the
raw body's checks; ``params.py``: the fields as SamplingParams), errors (``errors.py``),
request guards (``guards.py``), choices and SSE responses (``responses.py``), a stream's events (``events.py``),
the app (``app.py``) and serving with a graceful shutdown (``shutdown.py``, ``drain.py``). Its load benchmark is an
instrument: ``stages/bench/load/``."""
