"""Tooling around the engine, not the engine: command lines, workloads, reports, the roofline, demos and
the quality and edge lessons. Nothing under `common/` outside this folder imports from it."""
